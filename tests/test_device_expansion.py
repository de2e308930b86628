"""The SmolLM2 expansion budget bench's device plumbing (studies/device_expansion.py): ``--device`` refused with one
line where it cannot be had, nothing added to the CPU rows' setup, and the staged bundle's parts joined only when
every one is there and together they are the recorded file."""

import hashlib
import json
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
from studies import device_expansion  # noqa: E402
from studies.expansion_budget import main as bench_main  # noqa: E402


@pytest.mark.parametrize("argv, message", [
    (["--protocol", "smollm2", "--device", "cuda"], "--device cuda: no CUDA device"),
    (["--device", "cuda"], "--device cuda: --protocol smollm2 only (the main protocol pretrains and caches its "
                           "decoder on the CPU)"),
    (["--protocol", "smollm2", "--device", "mps"], "--device mps: cpu or cuda"),
])
def test_a_device_that_cannot_be_had_is_refused_with_one_line_before_anything_loads(argv, message, monkeypatch,
                                                                                    capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "rows.jsonl"
    with pytest.raises(SystemExit) as stop:
        bench_main([*argv, "--out", str(out)])
    assert stop.value.code == 2
    assert capsys.readouterr().err == message + "\n"
    assert not out.exists()


def test_the_cpu_adds_nothing_to_the_setup_so_new_cpu_rows_pair_with_the_recorded_ones():
    assert device_expansion.use_device(SimpleNamespace(device="cpu", protocol="smollm2")) == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_records_float32_and_turns_deterministic_algorithms_on():
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        setup = device_expansion.use_device(SimpleNamespace(device="cuda", protocol="smollm2"))
        assert setup["dtype"] == "float32" and setup["device"] == torch.cuda.get_device_name()
        assert torch.are_deterministic_algorithms_enabled() and not torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cuda.enable_flash_sdp(True)
        torch.backends.cuda.enable_mem_efficient_sdp(True)
        torch.backends.cuda.enable_cudnn_sdp(True)


def _staged(tmp_path, data: bytes, cut: int):
    """A staged bundle of ``data`` in two parts cut at ``cut``, as ``prepare`` writes them and the calls copy them."""
    parts = {"a": data[:cut], "b": data[cut:]}
    for name, part in parts.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.gguf.part").write_bytes(part)
    record = {"max_bytes": 10, "parts": list(parts), "gguf_sha256": hashlib.sha256(data).hexdigest()}
    (tmp_path / "b" / "bundle.json").write_text(json.dumps(record))
    return tmp_path


def test_join_rebuilds_the_recorded_file_from_its_parts(tmp_path):
    data = bytes(range(256)) * 5
    joined = device_expansion.join(_staged(tmp_path, data, 700))
    assert joined == tmp_path / "model.gguf"
    assert joined.read_bytes() == data


@pytest.mark.parametrize("damage, message", [
    ("missing", "part(s) a not staged"),
    ("changed", "the joined parts differ from the GGUF file the bundle recorded (SHA-256)"),
])
def test_join_refuses_a_missing_or_changed_part_with_one_line(damage, message, tmp_path, capsys):
    staged = _staged(tmp_path, bytes(range(200)), 50)
    part = staged / "a" / "model.gguf.part"
    if damage == "missing":
        part.unlink()
    else:
        part.write_bytes(b"\xff" + part.read_bytes()[1:])  # its first byte was 0
    with pytest.raises(SystemExit) as stop:
        device_expansion.join(staged)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (staged / "model.gguf").exists()
