"""Deployment artefacts: systemd units (systemd-analyze verify), the install script (run
into a scratch root), the CloudFormation stack (cfn-lint and its security properties),
and the image recipe with its GPU build gate."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from s4fs.config import Config, parse_config
from s4fs.service import runner

REPO = Path(__file__).resolve().parents[2]
SYSTEMD = REPO / "systemd"
DEPLOY = REPO / "deploy"
TEMPLATE = DEPLOY / "cfn-train-runner.yaml"
UNITS = sorted(p for p in SYSTEMD.iterdir() if p.suffix in (".service", ".mount", ".socket",
                                                              ".timer", ".target", ".path"))
SYSTEM_UNIT_DIRS = ("/usr/lib/systemd/system", "/lib/systemd/system")


# --- helpers ---------------------------------------------------------------------------

def unit_settings(path: Path) -> dict[str, list[str]]:
    """``Section.Key`` -> every value (systemd allows repeated keys)."""
    out: dict[str, list[str]] = {}
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return out


def _analyze_or_skip() -> str:
    tool = shutil.which("systemd-analyze")
    if not tool:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    return tool


def _system_units() -> str:
    for d in SYSTEM_UNIT_DIRS:
        if os.path.isfile(os.path.join(d, "multi-user.target")):
            return d
    pytest.skip("no systemd system units on this machine to verify against (apt-get install systemd)")


def make_verify_root(tmp_path: Path) -> Path:
    """A scratch root for `systemd-analyze verify --root`: the host's system units (the
    targets ours depend on) and stand-ins for the commands our units run, so verify
    checks our files without s4fs installed on this machine."""
    root = tmp_path / "root"
    (root / "usr/lib/systemd").mkdir(parents=True)
    shutil.copytree(_system_units(), root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    return root


def stub_exec_paths(root: Path, unit: Path) -> None:
    for key, values in unit_settings(unit).items():
        if key.split(".")[-1].startswith("Exec"):
            for v in values:
                exe = v.lstrip("-@:+!").split()[0]
                target = root / exe.lstrip("/")
                if not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text("#!/bin/sh\nexit 0\n")
                    target.chmod(0o755)


def verify(root: Path, *names: str) -> subprocess.CompletedProcess:
    return subprocess.run([_analyze_or_skip(), "verify", f"--root={root}", "--man=no",
                           "--generators=no", *names], capture_output=True, text=True,
                          timeout=120)


# --- systemd units --------------------------------------------------------------------------

def test_there_are_units_to_check():
    assert {p.name for p in UNITS} >= {"s4fs-runner.service", "mnt-s4.mount"}


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_passes_systemd_analyze_verify(tmp_path, unit):
    root = make_verify_root(tmp_path)
    shutil.copy(unit, root / "etc/systemd/system" / unit.name)
    stub_exec_paths(root, unit)
    res = verify(root, unit.name)
    # verify exits 0 even for unknown keys; any output at all is a finding
    assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), res.stdout + res.stderr


def test_systemd_analyze_verify_catches_a_broken_unit(tmp_path):
    """The check above is not vacuous: a mount unit whose name does not match its path,
    and a service with a misspelt key, are reported."""
    root = make_verify_root(tmp_path)
    mount = (SYSTEMD / "mnt-s4.mount").read_text().replace("Where=/mnt/s4", "Where=/mnt/other")
    (root / "etc/systemd/system/mnt-s4.mount").write_text(mount)
    res = verify(root, "mnt-s4.mount")
    assert res.returncode != 0 and "Where=" in res.stdout + res.stderr
    svc = (SYSTEMD / "s4fs-runner.service").read_text().replace("KillMode=", "KilMode=")
    (root / "etc/systemd/system/s4fs-runner.service").write_text(svc)
    stub_exec_paths(root, SYSTEMD / "s4fs-runner.service")
    res = verify(root, "s4fs-runner.service")
    assert "KilMode" in res.stdout + res.stderr


def test_runner_unit_choices():
    s = unit_settings(SYSTEMD / "s4fs-runner.service")
    one = {k: v[-1] for k, v in s.items()}
    assert one["Service.Type"] == "notify"                     # READY=1 once mounted
    assert one["Service.User"] == one["Service.Group"] == "s4fs"
    assert one["Service.Restart"] == "on-failure"
    assert one["Service.KillMode"] == "mixed"                  # SIGTERM to the runner only
    assert "s4fs runner" in one["Service.ExecStart"]
    # setuid fusermount3 must work: no NoNewPrivileges, CAP_SYS_ADMIN in the bounding set
    assert one["Service.NoNewPrivileges"] == "no"
    assert one["Service.CapabilityBoundingSet"] == "CAP_SYS_ADMIN"
    assert one.get("Service.AmbientCapabilities", "") == ""
    # a private mount namespace would hide the mount from the training job; options
    # that imply NoNewPrivileges would break fusermount3
    forbidden = {"ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices",
                 "ReadOnlyPaths", "ReadWritePaths", "InaccessiblePaths", "ProtectKernelTunables",
                 "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups",
                 "ProtectProc", "TemporaryFileSystem", "BindPaths", "PrivateUsers",
                 "SystemCallFilter", "SystemCallArchitectures", "RestrictAddressFamilies",
                 "RestrictNamespaces", "RestrictRealtime", "RestrictSUIDSGID",
                 "MemoryDenyWriteExecute", "LockPersonality", "ProtectClock",
                 "ProtectHostname", "DynamicUser", "MountFlags"}
    assert not forbidden & {k.split(".", 1)[1] for k in s if k.startswith("Service.")}
    # permanent failures are not restarted; the codes are the runner's
    prevent = set(one["Service.RestartPreventExitStatus"].split())
    assert prevent == {str(runner.EX_SOFTWARE), str(runner.EX_NOPERM), str(runner.EX_CONFIG)}
    assert str(runner.EX_UNAVAILABLE) not in prevent


def test_mount_unit_choices():
    s = {k: v[-1] for k, v in unit_settings(SYSTEMD / "mnt-s4.mount").items()}
    assert s["Mount.Type"] == "fuse.s4fs" and s["Mount.Where"] == "/mnt/s4"
    opts = s["Mount.Options"].split(",")
    assert "allow_other" in opts and "_netdev" in opts
    # the daemon's metrics go where a runner with manage_mount = false reads them
    assert s["Mount.Environment"] == f"PROMETHEUS_MULTIPROC_DIR={runner.EXTERNAL_METRICS_DIR}"


# --- config example -------------------------------------------------------------------------

def test_config_example_parses_to_the_documented_defaults():
    cfg = parse_config((DEPLOY / "config.example.toml").read_text(), source="example")
    assert cfg == Config()


# --- install script ---------------------------------------------------------------------------

def _seed_root(root: Path) -> None:
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "etc/group").write_text("root:x:0:\n")
    (root / "etc/shadow").write_text("root:*:19000:0:99999:7:::\n")
    (root / "etc/gshadow").write_text("root:*::\n")
    (root / "etc/fuse.conf").write_text("# mount_max = 1000\n#user_allow_other\n")


def _install(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(DEPLOY / "install.sh"), "--root", str(root), *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def fake_s4fs(tmp_path) -> str:
    """A stand-in s4fs installed in the scratch root at /opt/s4fs (where the image puts
    it); with --root, install.sh takes --s4fs-bin as a path inside the root."""
    bindir = tmp_path / "target/opt/s4fs/bin"
    bindir.mkdir(parents=True)
    for name in ("s4fs", "mount.fuse.s4fs"):
        (bindir / name).write_text("#!/bin/sh\nexit 0\n")
        (bindir / name).chmod(0o755)
    return "/opt/s4fs/bin/s4fs"


def _needs_root_tools():
    if os.geteuid() != 0:
        pytest.skip("install.sh needs root (it creates a user and sets owners)")
    if not shutil.which("useradd"):
        pytest.skip("useradd is missing (apt-get install passwd)")


def test_install_script_sets_up_user_dirs_config_fuse_and_units(tmp_path, fake_s4fs):
    _needs_root_tools()
    root = tmp_path / "target"
    _seed_root(root)
    store = "s3://my-bucket/ckpt?region=us-east-1&sse=aws:kms"
    res = _install(root, "--store", store, "--s4fs-bin", fake_s4fs)
    assert res.returncode == 0, res.stdout + res.stderr

    user = next(l for l in (root / "etc/passwd").read_text().splitlines() if l.startswith("s4fs:"))
    _, _, uid, gid, _, home, shell = user.split(":")
    assert int(uid) < 1000 and shell.endswith("nologin") and home == "/var/lib/s4fs"
    assert any(l.startswith("s4fs:") for l in (root / "etc/group").read_text().splitlines())

    def owner_mode(rel):
        st = os.stat(root / rel)
        return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)
    assert owner_mode("mnt/s4") == (int(uid), int(gid), 0o755)
    assert owner_mode("var/cache/s4fs") == (int(uid), int(gid), 0o750)
    assert owner_mode("var/lib/s4fs") == (int(uid), int(gid), 0o750)
    assert owner_mode("etc/s4fs/config.toml") == (0, int(gid), 0o640)

    cfg = parse_config((root / "etc/s4fs/config.toml").read_text())
    assert cfg.store == store and cfg.mountpoint == "/mnt/s4" and cfg.runner.manage_mount
    assert not cfg.marketplace.enabled

    fuse_lines = (root / "etc/fuse.conf").read_text().splitlines()
    assert fuse_lines.count("user_allow_other") == 1 and "#user_allow_other" not in fuse_lines

    assert os.readlink(root / "usr/local/bin/s4fs") == "/opt/s4fs/bin/s4fs"
    assert os.readlink(root / "sbin/mount.fuse.s4fs") == "/opt/s4fs/bin/mount.fuse.s4fs"
    unit = root / "etc/systemd/system/s4fs-runner.service"
    assert unit.read_text() == (SYSTEMD / "s4fs-runner.service").read_text()
    if shutil.which("systemctl"):
        assert (root / "etc/systemd/system/multi-user.target.wants/s4fs-runner.service").is_symlink()

    # a second run changes nothing and keeps the (possibly edited) config
    (root / "etc/s4fs/config.toml").write_text((root / "etc/s4fs/config.toml").read_text()
                                               .replace('device = "auto"', 'device = "cpu"'))
    res = _install(root, "--store", "/elsewhere", "--s4fs-bin", fake_s4fs)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "keeping the existing" in res.stdout
    assert (root / "etc/passwd").read_text().count("\ns4fs:") + \
        (root / "etc/passwd").read_text().startswith("s4fs:") == 1
    assert (root / "etc/fuse.conf").read_text().splitlines().count("user_allow_other") == 1
    assert parse_config((root / "etc/s4fs/config.toml").read_text()).device == "cpu"

    # what was installed verifies inside that root
    if shutil.which("systemd-analyze"):
        shutil.copytree(_system_units(), root / "usr/lib/systemd/system", symlinks=True,
                        dirs_exist_ok=True)
        res = verify(root, "s4fs-runner.service")
        assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), res.stdout + res.stderr


def test_install_script_mount_unit_for_another_mountpoint(tmp_path, fake_s4fs):
    _needs_root_tools()
    if not shutil.which("systemd-escape"):
        pytest.skip("systemd-escape is missing (apt-get install systemd)")
    root = tmp_path / "target"
    _seed_root(root)
    (root / "etc/fuse.conf").unlink()                     # no fuse.conf at all
    res = _install(root, "--mountpoint", "/mnt/ckpt", "--mount-unit", "--product-code",
                   "prod4s4fs", "--s4fs-bin", fake_s4fs)
    assert res.returncode == 0, res.stdout + res.stderr
    unit = root / "etc/systemd/system/mnt-ckpt.mount"
    s = {k: v[-1] for k, v in unit_settings(unit).items()}
    assert s["Mount.Where"] == "/mnt/ckpt" and s["Mount.What"] == "/var/lib/s4fs/store"
    cfg = parse_config((root / "etc/s4fs/config.toml").read_text())
    assert cfg.mountpoint == "/mnt/ckpt" and cfg.runner.manage_mount is False
    assert cfg.marketplace.enabled and cfg.marketplace.product_code == "prod4s4fs"
    assert "user_allow_other" in (root / "etc/fuse.conf").read_text().splitlines()
    if shutil.which("systemd-analyze"):
        shutil.copytree(_system_units(), root / "usr/lib/systemd/system", symlinks=True,
                        dirs_exist_ok=True)
        res = verify(root, "mnt-ckpt.mount", "s4fs-runner.service")
        assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), res.stdout + res.stderr


def test_install_script_passthrough_drop_in(tmp_path, fake_s4fs):
    """--passthrough gives the runner (and its mount daemon) CAP_SYS_ADMIN as an ambient
    capability, the one thing the kernel asks of a mount that registers backing files;
    a later run without the option keeps it and says how to turn it off."""
    _needs_root_tools()
    root = tmp_path / "target"
    _seed_root(root)
    res = _install(root, "--s4fs-bin", fake_s4fs)
    assert res.returncode == 0, res.stdout + res.stderr
    dropin = root / "etc/systemd/system/s4fs-runner.service.d/passthrough.conf"
    assert not dropin.exists()                      # not without the option
    res = _install(root, "--s4fs-bin", fake_s4fs, "--passthrough")
    assert res.returncode == 0, res.stdout + res.stderr
    assert dropin.read_text() == (SYSTEMD / "s4fs-runner.service.d/passthrough.conf").read_text()
    assert stat.S_IMODE(os.stat(dropin).st_mode) == 0o644
    assert unit_settings(dropin) == {"Service.AmbientCapabilities": ["CAP_SYS_ADMIN"]}
    # the unit's bounding set already holds it (fusermount3 needs it): the drop-in can work
    runner = unit_settings(SYSTEMD / "s4fs-runner.service")
    assert runner["Service.CapabilityBoundingSet"][-1] == "CAP_SYS_ADMIN"
    res = _install(root, "--s4fs-bin", fake_s4fs)
    assert res.returncode == 0 and dropin.exists()
    assert "remove it to turn passthrough off" in res.stdout
    if shutil.which("systemd-analyze"):
        shutil.copytree(_system_units(), root / "usr/lib/systemd/system", symlinks=True,
                        dirs_exist_ok=True)
        res = verify(root, "s4fs-runner.service")
        assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), res.stdout + res.stderr


def test_install_script_refuses_bad_input(tmp_path, fake_s4fs):
    _needs_root_tools()
    root = tmp_path / "target"
    _seed_root(root)
    for args, why in [(["--mountpoint", "rel/dir"], "absolute"),
                      (["--store", 'evil"quote'], "unsupported character"),
                      (["--bogus"], "unknown argument")]:
        res = _install(root, *args, "--s4fs-bin", fake_s4fs)
        assert res.returncode != 0 and why in res.stderr, (args, res.stderr)
    assert not (root / "etc/s4fs/config.toml").exists()


BINDING = REPO / "mount" / "binding"      # shipped: s4fs build-passthrough runs it
SCRIPTS = [DEPLOY / "install.sh", DEPLOY / "image/build.sh", DEPLOY / "image/gate.sh",
           BINDING / "build_pyfuse3.sh", BINDING / "libfuse_source.sh",
           REPO / "bench" / "build_fuse_c_floor.sh",      # sources libfuse_source.sh
           REPO / "bench" / "offline_kit.sh", REPO / "bench" / "gpu.sh"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shell_scripts_parse_and_pass_shellcheck(script):
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    res = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


# --- CloudFormation -----------------------------------------------------------------------------

def _template() -> dict:
    decode = pytest.importorskip("cfnlint.decode.cfn_yaml",
                                 reason="cfn-lint is not installed (pip install cfn-lint)")
    return decode.load(str(TEMPLATE))


def test_cfn_lint_is_clean():
    pytest.importorskip("cfnlint", reason="cfn-lint is not installed (pip install cfn-lint)")
    res = subprocess.run([sys.executable, "-c", "import sys; from cfnlint.runner import main; "
                          "sys.argv[0] = 'cfn-lint'; sys.exit(main())", "--include-checks", "I",
                          "--", str(TEMPLATE)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr


def test_cfn_parameters():
    p = _template()["Parameters"]
    types = p["InstanceType"]["AllowedValues"]
    assert types and all(re.fullmatch(r"g6e?\.\d*x?large", t) for t in types)
    assert {"g6.xlarge", "g6e.xlarge", "g6e.48xlarge"} <= set(types)
    assert p["ImageId"]["Type"] == "AWS::EC2::Image::Id"
    assert p["VpcId"]["Type"] == "AWS::EC2::VPC::Id"
    assert p["SubnetId"]["Type"] == "AWS::EC2::Subnet::Id"
    assert p["CreateBucket"]["AllowedValues"] == ["true", "false"]
    assert p["MountPoint"]["Default"] == "/mnt/s4"


def test_cfn_bucket_is_private_encrypted_tls_only_and_role_only():
    r = _template()["Resources"]
    b = r["CheckpointBucket"]
    assert b["Condition"] == "MakeBucket" and b["DeletionPolicy"] == "Retain"
    assert all(v is True for v in b["Properties"]["PublicAccessBlockConfiguration"].values())
    sse = b["Properties"]["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
    assert sse["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
    assert sse["ServerSideEncryptionByDefault"]["KMSMasterKeyID"] == {"Fn::GetAtt": ["CheckpointKey", "Arn"]}
    assert r["CheckpointKey"]["Properties"]["EnableKeyRotation"] is True
    stmts = {s["Sid"]: s for s in r["CheckpointBucketPolicy"]["Properties"]["PolicyDocument"]["Statement"]}
    assert stmts["TlsOnly"]["Effect"] == "Deny"
    assert stmts["TlsOnly"]["Condition"]["Bool"]["aws:SecureTransport"] == "false"
    role_arn = {"Fn::GetAtt": ["InstanceRole", "Arn"]}
    assert stmts["DataOnlyForTheInstanceRole"]["Condition"]["ArnNotEquals"]["aws:PrincipalArn"] == role_arn
    vpce = stmts["InstanceRoleOnlyThroughTheVpcEndpoint"]["Condition"]
    assert vpce["ArnEquals"]["aws:PrincipalArn"] == role_arn and "aws:SourceVpce" in vpce["StringNotEquals"]
    ep = r["S3Endpoint"]["Properties"]
    assert ep["VpcEndpointType"] == "Gateway"


def test_cfn_role_is_least_privilege():
    r = _template()["Resources"]
    role = r["InstanceRole"]["Properties"]
    assert "ManagedPolicyArns" not in role
    statements = []
    for pol in role["Policies"]:
        for s in pol["PolicyDocument"]["Statement"]:
            if isinstance(s, dict) and "Fn::If" in s:
                s = s["Fn::If"][1]
            statements.append(s)
    actions = [a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])]
    assert all(s["Effect"] == "Allow" for s in statements)
    assert not [a for a in actions if a.endswith("*")], "no wildcard actions"
    assert "aws-marketplace:RegisterUsage" in actions
    objects = next(s for s in statements if "s3:PutObject" in s["Action"])
    assert objects["Resource"] == {"Fn::Sub": "arn:${AWS::Partition}:s3:::${BucketName}/${Prefix}/*"}
    kms = [s for s in statements if any(a.startswith("kms:") for a in s["Action"])]
    assert kms and all(s["Condition"]["StringEquals"]["kms:ViaService"] for s in kms)
    assert set(a for s in kms for a in s["Action"]) == {"kms:GenerateDataKey", "kms:Decrypt"}


def test_cfn_instance_imdsv2_and_network():
    r = _template()["Resources"]
    lt = r["RunnerLaunchTemplate"]["Properties"]["LaunchTemplateData"]
    md = lt["MetadataOptions"]
    assert md["HttpTokens"] == "required" and md["HttpPutResponseHopLimit"] == 1
    assert lt["BlockDeviceMappings"][0]["Ebs"]["Encrypted"] is True
    sg = r["RunnerSecurityGroup"]["Properties"]
    rules = [x for x in sg["SecurityGroupIngress"] if "Fn::If" not in x]
    assert rules == [{"Description": "s4fs /healthz and /metrics", "IpProtocol": "tcp",
                      "FromPort": 8080, "ToPort": 8080, "CidrIp": {"Ref": "VpcCidr"}}]
    ssh = [x["Fn::If"][1] for x in sg["SecurityGroupIngress"] if "Fn::If" in x]
    assert all(x["CidrIp"] == {"Ref": "VpcCidr"} for x in ssh)
    inst = r["RunnerInstance"]["Properties"]
    assert inst["LaunchTemplate"]["LaunchTemplateId"] == {"Ref": "RunnerLaunchTemplate"}


def test_cfn_user_data_writes_a_valid_config_and_starts_the_runner():
    lt = _template()["Resources"]["RunnerLaunchTemplate"]["Properties"]["LaunchTemplateData"]
    script, variables = lt["UserData"]["Fn::Base64"]["Fn::Sub"]
    assert "MarketplaceEnabled" in variables
    body = re.search(r"<<'EOF'\n(.*?)\nEOF\n", script, re.S).group(1)
    values = {"BucketName": "my-ckpt-bucket", "Prefix": "team/run7", "AWS::Region": "us-west-2",
              "MountPoint": "/mnt/s4", "MarketplaceEnabled": "false",
              "MarketplaceProductCode": "", "MarketplacePublicKeyVersion": "1"}
    text = re.sub(r"\$\{([^}]+)\}", lambda m: values[m.group(1)], body)
    cfg = parse_config(text, source="user data")
    assert cfg.store == "s3://my-ckpt-bucket/team/run7?region=us-west-2"
    assert (cfg.mountpoint, cfg.health.port, cfg.runner.manage_mount) == ("/mnt/s4", 8080, True)
    assert not cfg.marketplace.enabled
    values.update(MarketplaceEnabled="true", MarketplaceProductCode="prod4s4fs")
    text = re.sub(r"\$\{([^}]+)\}", lambda m: values[m.group(1)], body)
    assert parse_config(text).marketplace.product_code == "prod4s4fs"
    assert "systemctl enable s4fs-runner.service" in script
    assert "systemctl restart s4fs-runner.service" in script


# --- image recipe and its gate ---------------------------------------------------------------------

def test_image_recipe_targets_ubuntu_2404_hwe_gpu_and_gates_on_selftest():
    text = (DEPLOY / "image/s4fs.pkr.hcl").read_text()
    hcl2 = pytest.importorskip("hcl2", reason="python-hcl2 is not installed (pip install python-hcl2)")
    doc = hcl2.loads(text)
    unq = lambda v: v.strip('"') if isinstance(v, str) else v  # noqa: E731
    src = doc["source"][0]['"amazon-ebs"']['"s4fs"']
    flt = src["source_ami_filter"][0]
    assert "ubuntu-noble-24.04" in unq(flt["filters"]["name"])
    assert unq(flt["owners"][0]) == "099720109477"                  # Canonical
    assert unq(src["metadata_options"][0]["http_tokens"]) == "required"
    provs = doc["build"][0]["provisioner"]
    scripts = [unq(p['"shell"'].get("script", "")) for p in provs if '"shell"' in p]
    assert scripts.index("${path.root}/build.sh") < scripts.index("${path.root}/gate.sh")
    default_type = next(v['"instance_type"'] for v in doc["variable"] if '"instance_type"' in v)
    assert re.fullmatch(r"g6e?\.\w+", unq(default_type["default"]))
    build = (DEPLOY / "image/build.sh").read_text()
    assert "[gpu,service,s3,fuse]" in build and "install.sh" in build
    # a kernel with FUSE passthrough (>= 6.9: 24.04's HWE kernel) with its driver's
    # modules, and the binding that asks for it, built into the image's venv
    assert "linux-generic-hwe-24.04" in build
    assert "linux-modules-nvidia-${driver}-server-generic-hwe-24.04" in build
    assert '"$venv/bin/s4fs" build-passthrough' in build
    # the runner's own mount takes passthrough too: the drop-in goes into the image
    assert re.search(r'install\.sh" --s4fs-bin "\$venv/bin/s4fs" --passthrough', build)
    uploads = [unq(p['"file"'].get("source", "")) for p in provs if '"file"' in p]
    assert "${path.root}/../../systemd/s4fs-runner.service.d" in uploads
    assert build.index("[gpu,service,s3,fuse]") < build.index('"$venv/bin/s4fs" build-passthrough')
    assert "s4fs selftest --device cuda --mount --require-passthrough" in \
        (DEPLOY / "image/gate.sh").read_text()


def _fake_prefix(tmp_path: Path, selftest_status: int) -> dict:
    """A stand-in install: `s4fs selftest` exits with ``selftest_status``; nvidia-smi
    and the runner's check succeed."""
    prefix = tmp_path / f"opt{selftest_status}"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin/s4fs").write_text(
        f'#!/bin/sh\necho "selftest $*"\n[ "$1" = selftest ] && exit {selftest_status}\nexit 0\n')
    (prefix / "bin/python").write_text("#!/bin/sh\ncat >/dev/null\necho 'boot check ok'\n")
    (prefix / "nv").mkdir()
    (prefix / "nv/nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA L4, 550.0, 23034 MiB'\n")
    for p in ("bin/s4fs", "bin/python", "nv/nvidia-smi"):
        (prefix / p).chmod(0o755)
    return dict(os.environ, S4FS_PREFIX=str(prefix),
                PATH=f"{prefix / 'nv'}:{os.environ.get('PATH', '/usr/bin:/bin')}")


@pytest.mark.parametrize("status", [0, 1, 2, 3])
def test_gate_fails_the_build_unless_selftest_passes(tmp_path, status):
    res = subprocess.run(["bash", str(DEPLOY / "image/gate.sh")], env=_fake_prefix(tmp_path, status),
                         capture_output=True, text=True, timeout=60)
    assert "selftest selftest --device cuda --mount --require-passthrough" in res.stdout
    if status == 0:
        assert res.returncode == 0 and "gate.sh: passed" in res.stdout, res.stderr
    else:
        assert res.returncode != 0 and "no image will be made" in res.stderr
        assert "gate.sh: passed" not in res.stdout
    if status == 3:                   # bytes exact, but no passthrough: says what it needs
        assert "did not use FUSE passthrough" in res.stderr and ">= 6.9" in res.stderr
