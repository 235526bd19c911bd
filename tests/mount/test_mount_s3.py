"""The mount on S3 (a real S3 HTTP server on loopback): shared buckets and failures."""

from __future__ import annotations

import hashlib
import os
import time

import pytest
import torch

from mount_helpers import s3_url

pytestmark = [pytest.mark.fuse, pytest.mark.s3]


def test_two_mounts_of_one_prefix_see_each_other(request, mount_factory):
    url = s3_url(request, "shared")
    a = mount_factory(store=url, name="node-a")
    b = mount_factory(store=url, name="node-b")
    sd = {"w": torch.randn(100_000), "b": torch.randn(64).to(torch.bfloat16)}
    torch.save(sd, os.path.join(a.path, "rank0.pt"))
    torch.save({"w": torch.ones(10)}, os.path.join(b.path, "rank1.pt"))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if {"rank0.pt", "rank1.pt"} <= set(os.listdir(b.path)) and \
                {"rank0.pt", "rank1.pt"} <= set(os.listdir(a.path)):
            break
        time.sleep(0.2)
    with open(os.path.join(a.path, "rank0.pt"), "rb") as f:
        ha = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(b.path, "rank0.pt"), "rb") as f:
        hb = hashlib.sha256(f.read()).hexdigest()
    assert ha == hb
    back = torch.load(os.path.join(b.path, "rank0.pt"))
    assert torch.equal(back["w"], sd["w"]) and torch.equal(back["b"], sd["b"])
    assert torch.equal(torch.load(os.path.join(a.path, "rank1.pt"))["w"], torch.ones(10))


def test_permanent_s3_failure_makes_save_raise(request, mount_factory, s3_server_process):
    from mount_helpers import FaultProxyProcess
    s3_fault_proxy = FaultProxyProcess(s3_server_process)
    request.addfinalizer(s3_fault_proxy.close)
    bucket = s3_url(request, "x").split("/")[2]
    url = (f"s3://{bucket}/faulty?endpoint_url={s3_fault_proxy.url}"
           f"&max_attempts=2&retry_seconds=2&backoff_base=0.01&backoff_max=0.05")
    m = mount_factory(store=url, name="faulty")
    good = os.path.join(m.path, "good.pt")
    torch.save({"x": torch.ones(10)}, good)
    s3_fault_proxy.inject("internal", method="PUT")
    bad = os.path.join(m.path, "bad.pt")
    with pytest.raises((OSError, RuntimeError)):
        torch.save({"x": torch.randn(1 << 20)}, bad)
    s3_fault_proxy.clear()
    assert not os.path.exists(bad), "a failed save must not look complete"
    assert torch.equal(torch.load(good)["x"], torch.ones(10))
    # transient throttling is retried and loses nothing
    s3_fault_proxy.inject("slowdown", times=1, method="PUT")
    torch.save({"x": torch.arange(1000)}, bad)
    assert torch.equal(torch.load(bad)["x"], torch.arange(1000))
