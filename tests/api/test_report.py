"""`s4fs report`: what a run's checkpoints cost — the numbers (checked against the
manifests), the HTML page opened in a real headless browser, the PNGs; and the progress
bars of the long CLI commands (on a terminal only)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import s4fs
from s4fs.report import file_report, run_report


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "s4fs.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def train_and_save(save, steps=(5, 10, 15, 20)):
    """A small bf16 model + AdamW trained for real; ``save(step, state)`` each step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                torch.nn.Linear(512, 256)).bfloat16()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(1, max(steps) + 1):
        loss = model(torch.randn(8, 256).bfloat16()).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step in steps:
            save(step, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "step": step})


def hf_run_in_store(root) -> str:
    """HF Trainer's layout: run/checkpoint-N/{model.pt, optimizer.pt} in a local store,
    with the delta chains' read budget raised so that these dense fine-tuning steps are
    stored as deltas (the report's delta column has something to count)."""
    from s4fs.coding import IngestConfig
    from s4fs.fs import FsConfig
    s4fs.filesystem(str(root), FsConfig(decoded_cache_bytes=0,
                                        ingest=IngestConfig(max_chain_read=4.0)))

    def save(step, state):
        fs, _ = s4fs.resolve(os.path.join(root, "x"), create=True)
        for d in ("run", f"run/checkpoint-{step}"):
            if not fs.exists(d):
                fs.mkdir(d)
        s4fs.save(state["model"], os.path.join(root, f"run/checkpoint-{step}/model.pt"))
        s4fs.save(state["optimizer"],
                  os.path.join(root, f"run/checkpoint-{step}/optimizer.pt"))
    train_and_save(save)
    # each save re-expresses the version before it as a delta in the background: wait
    # for that, so the report sees what the store will hold
    fs, _ = s4fs.resolve(os.path.join(root, "run"))
    assert fs.settle_deltas(timeout=120)
    return os.path.join(root, "run")


def test_report_numbers_match_the_manifests(tmp_path):
    run = hf_run_in_store(tmp_path / "store")
    fs, rel = s4fs.resolve(run)
    rep = run_report(fs, rel)
    assert [c["step"] for c in rep["checkpoints"]] == [5, 10, 15, 20]
    assert all(c["files"] == 2 for c in rep["checkpoints"])
    for c in rep["checkpoints"]:
        files = [file_report(fs, f"{c['name']}/{n}") for n in ("model.pt", "optimizer.pt")]
        assert c["logical"] == sum(f["logical"] for f in files)
        assert c["stored"] == sum(f["stored"] for f in files)
        fam = c["families"]
        assert sum(v["stored"] for v in fam.values()) == c["stored"]
        assert sum(v["logical"] for v in fam.values()) == c["logical"]
        assert fam["weights"]["logical"] > 0 and fam["exp_avg"]["logical"] > 0 \
            and fam["exp_avg_sq"]["logical"] > 0
        # AdamW keeps exp_avg and exp_avg_sq the shape of the weights (fp32 vs bf16 here)
        assert fam["exp_avg"]["logical"] == fam["exp_avg_sq"]["logical"]
    # the newest is stored whole, the ones before it as deltas toward it (backward)
    older = rep["checkpoints"][:-1]
    assert any(c["stored_delta"] > 0 for c in older), "consecutive steps should delta"
    assert rep["stored"] == sum(c["stored"] for c in rep["checkpoints"])
    assert 0 < rep["saving"] < 1
    big = rep["largest_tensors"][0]
    assert big["logical"] == max(t["logical"] for t in rep["largest_tensors"])
    assert {"exponent"} & set(big["planes"]), big["planes"]
    assert sum(big["planes"].values()) == big["stored"]


def test_report_cli_json_and_table(tmp_path):
    run = hf_run_in_store(tmp_path / "store")
    res = cli("report", run, "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert len(doc["checkpoints"]) == 4
    res = cli("report", run)
    assert res.returncode == 0 and "checkpoint-20" in res.stdout and "saved" in res.stdout
    res = cli("report", str(tmp_path / "store" / "nowhere"))
    assert res.returncode != 0 and "nowhere" in res.stderr


def _colour_share(png: str, rgb: tuple[int, int, int], tol: int = 12) -> float:
    from PIL import Image
    img = Image.open(png).convert("RGB")
    px = img.get_flattened_data() if hasattr(img, "get_flattened_data") else \
        img.getdata()
    hits = sum(1 for p in px if all(abs(a - b) <= tol for a, b in zip(p, rgb)))
    return hits / (img.width * img.height)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed "
                    "(make test installs Debian's chromium)")
def test_report_html_renders_in_a_real_browser(tmp_path):
    run = hf_run_in_store(tmp_path / "store")
    page = tmp_path / "report.html"
    res = cli("report", run, "--out", str(page), "--png", str(tmp_path / "png"), "-q")
    assert res.returncode == 0, res.stderr
    text = page.read_text()
    assert "<svg" in text and "http://" not in text.split("<svg", 1)[0].lower()
    shot = tmp_path / "shot.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'chrome'}", "--window-size=1100,1400",
                    f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120)
    assert shot.exists(), "chromium wrote no screenshot"
    # the bars of the first plot are drawn: weights blue, exp_avg orange, exp_avg_sq green
    for colour in ((0x4C, 0x72, 0xB0), (0xDD, 0x84, 0x52), (0x55, 0xA8, 0x68)):
        assert _colour_share(str(shot), colour) > 0.005, f"no {colour} bars in the page"
    pngs = sorted(os.listdir(tmp_path / "png"))
    assert len(pngs) == 3
    assert _colour_share(str(tmp_path / "png" / pngs[0]), (0x4C, 0x72, 0xB0)) > 0.005


@pytest.mark.fuse
def test_report_under_a_mount(mount_factory):
    m = mount_factory()

    def save(step, state):
        d = os.path.join(m.path, f"step_{step}")
        os.makedirs(d, exist_ok=True)
        torch.save(state, os.path.join(d, "state.pt"))
    train_and_save(save)
    res = cli("report", m.path, "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert [c["step"] for c in doc["checkpoints"]] == [5, 10, 15, 20]


@pytest.mark.s3
def test_report_of_an_s3_prefix(s3_endpoint, s3_bucket, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    train_and_save(lambda step, state: s4fs.save(state,
                                                 f"s3://{s3_bucket}/run/ckpt_{step}.pt"))
    fs, rel = s4fs.resolve(f"s3://{s3_bucket}/run/ckpt_5.pt")
    rep = run_report(fs, "")
    assert [c["step"] for c in rep["checkpoints"]] == [5, 10, 15, 20]
    res = cli("report", f"s3://{s3_bucket}/run/ckpt_20.pt", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["checkpoints"][0]["step"] == 20


def _on_a_terminal(argv: list[str]) -> tuple[int, bytes]:
    """Run ``argv`` on a pseudo-terminal 100 columns wide; (exit code, what it printed)."""
    import fcntl
    import pty
    import struct
    import termios
    pid, fd = pty.fork()
    if pid == 0:                                         # the child: on the terminal
        fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        os.execv(argv[0], argv)
    out = bytearray()
    try:
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            out.extend(data)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), bytes(out)


def test_progress_bars_on_a_terminal_only(tmp_path):
    run = hf_run_in_store(tmp_path / "store")
    target = os.path.join(run, "checkpoint-20", "optimizer.pt")
    plain = cli("verify", target)
    assert plain.returncode == 0 and "%" not in plain.stderr      # not a terminal: none
    code, out = _on_a_terminal([sys.executable, "-m", "s4fs.cli", "verify", target])
    assert code == 0 and b"verify" in out and b"%|" in out, out.decode(errors="replace")
    code, out = _on_a_terminal([sys.executable, "-m", "s4fs.cli", "verify", "-q", target])
    assert code == 0 and b"%|" not in out and b"ok" in out
