"""llama.cpp's quantizer makes the type a config asks for, into a cache keyed by source and type.

The files are checked with the ``gguf`` package's own reader (the tensors' types, not only the header's
``general.file_type``) and their size against the source's.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

import gguf
import llama_cpp
import pytest

from oasst_cpu_backend.loading import LoadError, plan_load
from oasst_cpu_backend.model_files import LLAMA_FILE_TYPES, PRECISION_ORDER, read_gguf, source_files
from oasst_cpu_backend.quantize import QuantizeProgress, cache_path, quantized
from oasst_cpu_backend.settings import Settings, default_model_path
from oasst_shared.model_configs import SMOLLM2_135M, SMOLLM2_135M_Q8, ModelConfig

pytestmark = pytest.mark.slow


def tensor_types(path: Path) -> Counter[str]:
    return Counter(t.tensor_type.name for t in gguf.GGUFReader(path).tensors if len(t.shape) >= 2)


def test_our_type_names_are_llama_cpps_file_types() -> None:
    assert set(LLAMA_FILE_TYPES) == set(PRECISION_ORDER)
    for name, number in LLAMA_FILE_TYPES.items():
        llama_name = "ALL_F32" if name == "f32" else f"MOSTLY_{name.upper()}"
        assert number == getattr(llama_cpp, f"LLAMA_FTYPE_{llama_name}") == gguf.LlamaFileType[llama_name]


def test_the_header_reader_agrees_with_the_gguf_package() -> None:
    ours = read_gguf(default_model_path())
    theirs = gguf.GGUFReader(default_model_path())

    def scalar(key: str) -> int:
        field = theirs.fields[key]
        return int(field.parts[field.data[0]][0])

    assert LLAMA_FILE_TYPES[ours.file_type or ""] == scalar("general.file_type")
    assert ours.context_length == scalar("llama.context_length") == 8192
    assert ours.architecture == "llama"


def test_q4_1_to_q8_0_with_progress_and_a_cache(tmp_path: Path) -> None:
    source = read_gguf(default_model_path())
    assert source.file_type == "q4_1"
    progress = QuantizeProgress()
    made = quantized(source, "q8_0", tmp_path, threads=1, progress=progress)
    assert made == cache_path(source, "q8_0", tmp_path)
    assert read_gguf(made).file_type == "q8_0"
    # Every quantizable matrix is Q8_0 now (llama.cpp's reader of the tensor table, not our header read).
    assert set(tensor_types(made)) == {"Q8_0"}
    # 8.5 bits per weight where the source had 5 (measured: 92 -> 136 MiB).
    assert 1.3 < made.stat().st_size / source.size < 1.6
    assert progress.tensors_total == len(gguf.GGUFReader(source.path).tensors) == progress.tensors_done
    # No half file is left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([made.name, made.name + ".lock"])

    # A second request uses the cache: the file is not made again.
    before = made.stat().st_mtime_ns
    again = QuantizeProgress()
    assert quantized(source, "q8_0", tmp_path, threads=1, progress=again) == made
    assert made.stat().st_mtime_ns == before and again.tensors_done == 0


def test_q4_0_and_a_changed_source_is_a_new_cache_entry(tmp_path: Path) -> None:
    copy = tmp_path / "SmolLM2.Q4_1.gguf"
    shutil.copy(default_model_path(), copy)
    source = read_gguf(copy)
    cache = tmp_path / "cache"
    made = quantized(source, "q4_0", cache, threads=1)
    assert read_gguf(made).file_type == "q4_0"
    # llama.cpp keeps a matrix whose rows do not divide into Q4_0 blocks in a fallback type.
    types = tensor_types(made)
    assert types.most_common(1)[0][0] == "Q4_0" and sum(types.values()) - types["Q4_0"] <= 2
    assert made.stat().st_size < source.size  # 4.5 bits per weight where the source had 5
    os.utime(copy, ns=(source.path.stat().st_atime_ns, source.path.stat().st_mtime_ns + 10**9))
    assert cache_path(read_gguf(copy), "q4_0", cache) != made


def test_a_source_of_the_asked_type_is_served_as_it_is(tmp_path: Path) -> None:
    source = read_gguf(default_model_path())
    assert quantized(source, "q4_1", tmp_path, threads=1) == source.path
    assert list(tmp_path.iterdir()) == []


def test_the_most_precise_file_of_a_folder_is_the_source(tmp_path: Path) -> None:
    shutil.copy(default_model_path(), tmp_path / "a.Q4_1.gguf")
    quantized(read_gguf(tmp_path / "a.Q4_1.gguf"), "q8_0", tmp_path / "made", threads=1)
    (next((tmp_path / "made").glob("*.q8_0.gguf"))).rename(tmp_path / "b.Q8_0.gguf")
    assert [f.file_type for f in source_files(tmp_path)] == ["q8_0", "q4_1"]
    settings = Settings(cache_dir=tmp_path / "cache")
    folder = str(tmp_path)
    # q4_0 is made from the Q8_0 file; q4_1 is served from the Q4_1 file as it is.
    to_q4_0 = plan_load(
        settings, ModelConfig(name="m", model_id="m", backend="cpu", model_path=folder, quantization="q4_0")
    )
    assert (to_q4_0.source.file_type, to_q4_0.target) == ("q8_0", "q4_0")
    as_is = plan_load(
        settings, ModelConfig(name="m", model_id="m", backend="cpu", model_path=folder, quantization="q4_1")
    )
    assert as_is.source.file_type == "q4_1"


def test_the_plan_takes_the_context_from_the_config_or_the_model(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path, n_ctx=4096)
    # The built-in sets 2048; a config that does not is bounded by the setting and the trained 8192.
    assert plan_load(settings, SMOLLM2_135M).n_ctx == 2048
    assert plan_load(settings, SMOLLM2_135M_Q8).target == "q8_0"
    # A float type asked as dtype (no quantization) is a file of that type too.
    as_f16 = ModelConfig(name="m", model_id="m", backend="cpu", dtype="float16")
    assert plan_load(settings, as_f16).target == "f16"
    shipped = plan_load(settings, SMOLLM2_135M)
    assert shipped.target == shipped.source.file_type == "q4_1"  # as shipped: nothing to make
    open_config = ModelConfig(name="m", model_id="m", backend="cpu")
    assert plan_load(settings, open_config).n_ctx == 4096
    assert plan_load(Settings(cache_dir=tmp_path, n_ctx=16384), open_config).n_ctx == 8192
    with pytest.raises(LoadError, match="not the CPU backend"):
        plan_load(settings, ModelConfig(name="m", model_id="m"))
    with pytest.raises(LoadError, match="model file not found"):
        plan_load(
            settings, ModelConfig(name="m", model_id="m", backend="cpu", model_path=str(tmp_path / "x.gguf"))
        )
    (tmp_path / "junk.gguf").write_bytes(b"not a model")
    with pytest.raises(LoadError, match="not a readable GGUF file"):
        plan_load(
            settings,
            ModelConfig(name="m", model_id="m", backend="cpu", model_path=str(tmp_path / "junk.gguf")),
        )
