# The s4fs training image: Ubuntu 24.04 with its HWE kernel (>= 6.9: FUSE passthrough) +
# NVIDIA driver + s4fs (gpu, service, s3, fuse) + pyfuse3 built with passthrough
# (`s4fs build-passthrough`) + the systemd units, with a build gate: `s4fs selftest
# --device cuda --mount --require-passthrough` must report every GPU compress ->
# decompress round trip bit-exact and every byte written through a real mount read back
# exactly, moved by FUSE passthrough, or the build fails and no image is made.
#
#   python -m build --wheel              # in the repository: dist/s4fs-*.whl
#   packer init deploy/image
#   packer build -var region=us-east-1 -var s4fs_wheel=dist/s4fs-0.1.0-py3-none-any.whl \
#       deploy/image
#
# The build instance must have an NVIDIA GPU (the gate runs on it), so the instance type
# is a g6/g6e like the ones the image is for.

packer {
  required_plugins {
    amazon = {
      source  = "github.com/hashicorp/amazon"
      version = ">= 1.3.0"
    }
  }
}

variable "region" {
  type        = string
  description = "Region to build the image in."
}

variable "instance_type" {
  type        = string
  default     = "g6.xlarge"
  description = "Build instance; needs an NVIDIA GPU for the selftest gate."
  validation {
    condition     = can(regex("^g6e?\\.[0-9]*x?large$", var.instance_type))
    error_message = "The build runs the GPU gate: use a g6 or g6e instance type."
  }
}

variable "s4fs_wheel" {
  type        = string
  description = "Path of the s4fs wheel to install (python -m build --wheel)."
}

variable "nvidia_driver" {
  type        = string
  default     = "580"
  description = "NVIDIA server driver branch (L4 and L40S need 525 or newer; build.sh installs Canonical's prebuilt modules for the HWE kernel, which 580 tracks)."
}

variable "torch_index_url" {
  type        = string
  default     = "https://download.pytorch.org/whl/cu124"
  description = "Where pip finds the CUDA build of torch."
}

variable "subnet_id" {
  type        = string
  default     = ""
  description = "Optional subnet for the build instance (default VPC otherwise)."
}

variable "ami_name_prefix" {
  type    = string
  default = "s4fs-train-runner"
}

locals {
  stamp = formatdate("YYYYMMDD-hhmmss", timestamp())
}

source "amazon-ebs" "s4fs" {
  region        = var.region
  instance_type = var.instance_type
  subnet_id     = var.subnet_id == "" ? null : var.subnet_id
  ssh_username  = "ubuntu"
  ami_name      = "${var.ami_name_prefix}-${local.stamp}"
  ami_description = "s4fs lossless checkpoint filesystem runner (Ubuntu 24.04, HWE kernel, FUSE passthrough, NVIDIA ${var.nvidia_driver})"
  imds_support  = "v2.0"

  source_ami_filter {
    owners      = ["099720109477"] # Canonical
    most_recent = true
    filters = {
      name                = "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"
      root-device-type    = "ebs"
      virtualization-type = "hvm"
      architecture        = "x86_64"
    }
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  launch_block_device_mappings {
    device_name           = "/dev/sda1"
    volume_size           = 60
    volume_type           = "gp3"
    encrypted             = true
    delete_on_termination = true
  }

  tags = {
    Name      = "${var.ami_name_prefix}-${local.stamp}"
    BaseImage = "{{ .SourceAMIName }}"
    Gate      = "s4fs selftest --device cuda --mount --require-passthrough"
  }
}

build {
  sources = ["source.amazon-ebs.s4fs"]

  # what build.sh installs: the wheel, the units and the install script
  provisioner "shell" {
    inline = ["mkdir -p /tmp/s4fs-src/deploy /tmp/s4fs-src/systemd"]
  }
  provisioner "file" {
    source      = var.s4fs_wheel
    destination = "/tmp/s4fs-src/"
  }
  provisioner "file" {
    sources     = ["${path.root}/../install.sh", "${path.root}/../config.example.toml"]
    destination = "/tmp/s4fs-src/deploy/"
  }
  provisioner "file" {
    sources     = ["${path.root}/../../systemd/s4fs-runner.service", "${path.root}/../../systemd/mnt-s4.mount"]
    destination = "/tmp/s4fs-src/systemd/"
  }
  # the runner's FUSE passthrough drop-in (install.sh --passthrough): the folder itself
  provisioner "file" {
    source      = "${path.root}/../../systemd/s4fs-runner.service.d"
    destination = "/tmp/s4fs-src/systemd/"
  }

  # packages, the NVIDIA driver, s4fs in /opt/s4fs, the user and units
  provisioner "shell" {
    script          = "${path.root}/build.sh"
    execute_command = "chmod +x {{ .Path }}; sudo -E {{ .Path }}"
    environment_vars = [
      "S4FS_SRC=/tmp/s4fs-src",
      "NVIDIA_DRIVER=${var.nvidia_driver}",
      "TORCH_INDEX_URL=${var.torch_index_url}",
    ]
  }

  # the new driver and the HWE kernel (FUSE passthrough) need the reboot
  provisioner "shell" {
    inline            = ["sudo systemctl reboot"]
    expect_disconnect = true
  }

  # THE GATE: every GPU round trip bit-exact, every byte through a real mount by FUSE
  # passthrough, or no image
  provisioner "shell" {
    pause_before    = "30s"
    script          = "${path.root}/gate.sh"
    execute_command = "chmod +x {{ .Path }}; sudo -E {{ .Path }}"
  }

  # leave no build traces in the image
  provisioner "shell" {
    inline = [
      "sudo rm -rf /tmp/s4fs-src",
      "sudo cloud-init clean --logs",
    ]
  }
}
