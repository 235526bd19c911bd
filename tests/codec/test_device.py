"""Where coding runs: the one decision in ``s4fs.codec._device``, and what users see of it
(the config, the mount's ``--device``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from s4fs.codec import _device, compress, gpu_available
from s4fs.errors import CodecError, CodecUnavailableError


def test_unknown_device_is_refused_with_the_choices():
    for bad in ("gpu", "CUDA", ""):
        with pytest.raises(CodecError, match="'auto', 'cpu' or 'cuda'"):
            _device.check(bad)
        with pytest.raises(CodecError, match="'auto', 'cpu' or 'cuda'"):
            compress(b"\0" * 64, "bytes", device=bad)


def test_auto_pipeline_takes_the_gpu_only_where_it_is_faster(monkeypatch):
    monkeypatch.setattr(_device, "gpu_available", lambda: False)
    assert _device.pipeline("auto") == "cpu"
    monkeypatch.setattr(_device, "gpu_available", lambda: True)
    monkeypatch.setattr(os, "cpu_count", lambda: _device.AUTO_GPU_BELOW_CORES - 1)
    assert _device.pipeline("auto") == "cuda"
    monkeypatch.setattr(os, "cpu_count", lambda: _device.AUTO_GPU_BELOW_CORES)
    assert _device.pipeline("auto") == "cpu"           # the CPU workers are as fast there
    assert _device.pipeline("cpu") == "cpu"


def test_auto_per_call_prefers_device_data_and_large_host_buffers(monkeypatch):
    monkeypatch.setattr(_device, "gpu_available", lambda: True)
    assert not _device.use_gpu("auto", b"\0" * (_device.AUTO_MIN_HOST_BYTES - 1))
    assert _device.use_gpu("auto", b"\0" * _device.AUTO_MIN_HOST_BYTES)
    assert not _device.use_gpu("cpu", b"\0" * _device.AUTO_MIN_HOST_BYTES)
    monkeypatch.setattr(_device, "gpu_available", lambda: False)
    assert not _device.use_gpu("auto", b"\0" * (64 << 20))


@pytest.mark.skipif(gpu_available(), reason="a GPU is present here")
def test_cuda_pipeline_without_a_gpu_says_what_to_install():
    with pytest.raises(CodecUnavailableError) as exc:
        _device.pipeline("cuda")
    assert "pip install" in str(exc.value) and "device='cpu'" in str(exc.value)


def test_config_device_is_checked_by_the_same_list(tmp_path):
    from s4fs.config import ConfigError, load_config
    path = tmp_path / "config.toml"
    path.write_text('store = "/data/store"\nmountpoint = "/mnt/s4"\ndevice = "gpu"\n')
    with pytest.raises(ConfigError, match='device must be one of'):
        load_config(str(path))


@pytest.mark.fuse
@pytest.mark.skipif(gpu_available(), reason="a GPU is present here")
def test_mount_with_device_cuda_on_a_cpu_box_fails_at_once(tmp_path):
    """The mount refuses to start (it does not come up and then fail every save), with
    the message saying what is missing."""
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    cli = [sys.executable, "-m", "s4fs.cli"]
    subprocess.run(cli + ["init", str(store)], check=True, capture_output=True, timeout=60)
    r = subprocess.run(cli + ["mount", str(store), str(mnt), "--device", "cuda",
                              "--cache-dir", str(tmp_path / "cache")],
                       capture_output=True, text=True, timeout=120)
    try:
        assert r.returncode != 0
        assert "needs a CUDA GPU" in r.stderr and "pip install" in r.stderr, r.stderr
        assert not os.path.ismount(mnt)
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", str(mnt)], timeout=30)
