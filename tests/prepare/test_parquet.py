"""prepare.py --input on .parquet files and folders of them: token for token the same as the
texts given as .jsonl, with every tokenizer; nulls skipped as empty documents; a bad file is
one error naming it, with nothing written. eval.py's --input reads Parquet the same way."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import prepare
from gptkit.ops.errors import UserError
from gptkit.prepare import parquet as prepare_parquet
from gptkit.prepare.sources import iter_documents, resolve_inputs
from hub_server import random_texts


def prep(data, name, *args):
    prepare.main(["--name", name, "--data_dir", str(data), "--quiet", "--workers", "1", *args])
    meta = json.loads((data / name / "meta.json").read_text())
    return meta, [(data / name / f"{s}.bin").read_bytes() for s in ("train", "val")]


def write_jsonl(path, texts):
    with open(path, "w") as f:
        for text in texts:
            f.write(json.dumps({"text": text or ""}) + "\n")


@pytest.fixture
def corpus(tmp_path):
    """Two Parquet files in a folder (with a null and an empty text), and the same texts as .jsonl."""
    a, b = random_texts(120, seed=1), random_texts(80, seed=2)
    a[7], b[3] = None, ""
    folder = tmp_path / "pq"
    (folder / "sub").mkdir(parents=True)
    pq.write_table(pa.table({"id": list(range(120)), "text": a}), folder / "a.parquet", row_group_size=16)
    pq.write_table(pa.table({"text": pa.array(b, pa.large_string())}), folder / "sub" / "b.parquet",
                   row_group_size=7)
    write_jsonl(tmp_path / "same.jsonl", a + b)
    txt = tmp_path / "txt"
    txt.mkdir()
    for i, text in enumerate(a + b):  # one .txt file per document, in the same order
        (txt / f"{i:04d}.txt").write_text(text or "", encoding="utf-8")
    return folder, tmp_path / "same.jsonl"


@pytest.mark.parametrize("tokenizer", [["char"], ["gpt2"], ["bpe", "--vocab_size", "300"]])
def test_parquet_folder_equals_the_same_texts_as_jsonl(corpus, tmp_path, tokenizer, request):
    if tokenizer == ["gpt2"]:
        request.getfixturevalue("tiktoken_available")
    folder, jsonl = corpus
    data = tmp_path / "data"
    meta, got = prep(data, "p", "--input", str(folder), "--tokenizer", *tokenizer)
    ref_meta, want = prep(data, "j", "--input", str(jsonl), "--tokenizer", *tokenizer)
    assert got == want and all(got)
    _, as_txt = prep(data, "t", "--input", str(tmp_path / "txt"), "--tokenizer", *tokenizer)
    assert as_txt == want
    assert meta["split"]["num_documents"] == 198  # the null and the empty text are skipped
    assert [s["path"] for s in meta["sources"]] == [str(folder / "a.parquet"), str(folder / "sub" / "b.parquet")]
    for source in meta["sources"]:  # the file's own sha256, as for every other input
        import hashlib

        assert source["sha256"] == hashlib.sha256(open(source["path"], "rb").read()).hexdigest()


def test_other_column_and_small_batches(tmp_path, monkeypatch):
    texts = random_texts(50, seed=3)
    pq.write_table(pa.table({"body": texts, "text": [1] * 50}), tmp_path / "x.parquet", row_group_size=9)
    write_jsonl(tmp_path / "x.jsonl", texts)
    monkeypatch.setattr(prepare_parquet, "BATCH_ROWS", 4)
    _, got = prep(tmp_path / "d", "p", "--input", str(tmp_path / "x.parquet"), "--text_column", "body",
                  "--tokenizer", "char")
    _, want = prep(tmp_path / "d", "j", "--input", str(tmp_path / "x.jsonl"), "--tokenizer", "char")
    assert got == want


def assert_refused(tmp_path, args, message):
    out = tmp_path / "out"
    with pytest.raises(UserError, match=message) as e:
        prepare.main([*args, "--name", "x", "--tokenizer", "char", "--data_dir", str(out), "--quiet"])
    assert "\n" not in str(e.value)
    assert not out.exists() or not any(out.rglob("*")), list(out.rglob("*"))


def test_bad_parquet_inputs_are_one_line_errors_naming_the_file(tmp_path):
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"text": ["some text", "more text"], "n": [1, 2]}), good)
    fake = tmp_path / "fake.parquet"
    fake.write_text('{"text": "I am json"}\n')
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(good.read_bytes()[:-20])
    assert_refused(tmp_path, ["--input", str(fake)], f"input {fake} is not a readable Parquet file")
    assert_refused(tmp_path, ["--input", str(cut)], f"input {cut} is not a readable Parquet file")
    assert_refused(tmp_path, ["--input", str(good), "--text_column", "body"],
                   f"input {good} has no column 'body' \\(its columns: text, n\\)")
    assert_refused(tmp_path, ["--input", str(good), "--text_column", "n"],
                   f"input {good}: column 'n' holds int64, not text")
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "a.txt").write_text("hello there")
    (folder / "z.parquet").write_bytes(fake.read_bytes())
    assert_refused(tmp_path, ["--input", str(folder)], "z.parquet is not a readable Parquet file")
    (tmp_path / "t.txt").write_text("hello")
    assert_refused(tmp_path, ["--input", str(tmp_path / "t.txt"), "--text_column", "body"],
                   "no input is a .parquet file")


def test_invalid_utf8_is_named_by_row_or_replaced(tmp_path):
    bad = pa.array([b"fine text", b"bad \xff\xfe here", None], pa.binary()).view(pa.string())  # no check
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"text": bad}), path)
    assert_refused(tmp_path, ["--input", str(path)], f"{path}, row 2: not valid UTF-8 at byte 4 .*--errors replace")
    meta, _ = prep(tmp_path / "d", "r", "--input", str(path), "--tokenizer", "char", "--errors", "replace")
    assert "\ufffd" in meta["tokenizer"]["chars"] and meta["split"]["num_documents"] == 2


def test_a_failure_after_the_start_leaves_the_previous_dataset(tmp_path, monkeypatch):
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"text": random_texts(40, seed=4)}), path, row_group_size=8)
    data = tmp_path / "data"
    _, before = prep(data, "p", "--input", str(path), "--tokenizer", "char")
    real = prepare_parquet.parquet_texts

    def failing(source, errors, on_raw=None):  # the file breaks mid-way through the second pass
        for i, text in enumerate(real(source, errors, on_raw)):
            if i == 20 and on_raw is not None and failing.calls == 1:
                raise UserError(f"input {source.shown} could not be read past row 20 (simulated)")
            yield text
        failing.calls += 1

    failing.calls = 0
    import gptkit.prepare.sources as sources

    monkeypatch.setattr(sources, "parquet_texts", failing)
    pq.write_table(pa.table({"text": random_texts(40, seed=5)}), path, row_group_size=8)
    with pytest.raises(UserError, match="past row 20"):
        prep(data, "p", "--input", str(path), "--tokenizer", "char")
    assert [(data / "p" / f"{s}.bin").read_bytes() for s in ("train", "val")] == before
    assert sorted(p.name for p in (data / "p").iterdir()) == [".lock", "meta.json", "train.bin", "val.bin"]


TEXT_LAYOUTS = {  # Arrow's ways of holding a string column, as Parquet writers leave them
    "string": lambda texts: pa.array(texts, pa.string()),
    "large_string": lambda texts: pa.array(texts, pa.large_string()),
    "string_view": lambda texts: pa.array(texts, pa.string_view()),
    "dictionary": lambda texts: pa.array(texts, pa.string()).dictionary_encode(),  # a pandas Categorical
    "dictionary_int32_large": lambda texts: pa.DictionaryArray.from_arrays(
        pa.array([i if t is not None else None for i, t in enumerate(texts)], pa.int32()),
        pa.array([t or "" for t in texts], pa.large_string())),
}


@pytest.mark.parametrize("layout", list(TEXT_LAYOUTS))
def test_every_text_layout_reads_as_text(tmp_path, layout):
    texts = random_texts(60, seed=6)
    texts[5], texts[9] = None, texts[3]  # a null, and a repeated text (what a dictionary shares)
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"text": TEXT_LAYOUTS[layout](texts)}), path, row_group_size=16)
    write_jsonl(tmp_path / "x.jsonl", texts)
    kind = pq.ParquetFile(path).schema_arrow.field("text").type
    assert (layout.startswith("dictionary")) == pa.types.is_dictionary(kind), kind  # read back as written
    _, got = prep(tmp_path / "d", "p", "--input", str(path), "--tokenizer", "char")
    _, want = prep(tmp_path / "d", "j", "--input", str(tmp_path / "x.jsonl"), "--tokenizer", "char")
    assert got == want and all(got)
    read = ["".join(doc) for doc in iter_documents(resolve_inputs([str(path)]))]  # eval.py --input's reader
    assert read == [t for t in texts if t]


def test_a_bad_dictionary_is_one_line_naming_the_file(tmp_path):
    values = pa.array([b"fine text", b"bad \xff here"], pa.binary()).view(pa.string())
    bad = pa.DictionaryArray.from_arrays(pa.array([0, 0, 1], pa.int8()), values)
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"text": bad}), path)
    # pyarrow checks a dictionary's UTF-8 as it reads it (a plain column is checked row by row, above)
    assert_refused(tmp_path, ["--input", str(path)], f"input {path} could not be read .*UTF8|{path}, row 3: not valid")
    numbers = tmp_path / "numbers.parquet"  # a dictionary of numbers is still not text
    pq.write_table(pa.table({"text": pa.array([1, 2, 1]).dictionary_encode()}), numbers)
    assert_refused(tmp_path, ["--input", str(numbers)], "column 'text' holds .*int64.*not text")


def test_eval_reads_parquet_documents(corpus):
    folder, jsonl = corpus
    from_parquet = ["".join(doc) for doc in iter_documents(resolve_inputs([str(folder)]))]
    from_jsonl = ["".join(doc) for doc in iter_documents(resolve_inputs([str(jsonl)]))]
    assert from_parquet == from_jsonl and len(from_parquet) == 198


PEAK_RSS = """
import sys
from gptkit.prepare import build
build.prepare_dataset([sys.argv[1]], "char", "m", sys.argv[2], workers=1, progress=False)
print([line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")][0])  # KiB
"""


def test_peak_memory_does_not_grow_with_a_parquet_input(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from repo import REPO

    if not Path("/proc/self/status").exists():
        pytest.skip("reads VmHWM from Linux's /proc")
    row = "The quick brown fox jumps over the lazy dog; sphinx of black quartz, judge my vow.\n" * 12
    peaks = {}
    for mb in (4, 32):
        path = tmp_path / f"{mb}.parquet"
        pq.write_table(pa.table({"text": [row] * (mb * 2**20 // len(row))}), path, row_group_size=1024)
        result = subprocess.run([sys.executable, "-c", PEAK_RSS, str(path), str(tmp_path / str(mb))],
                                capture_output=True, text=True, cwd=REPO)
        assert result.returncode == 0, result.stderr
        peaks[mb] = int(result.stdout.split()[-1]) / 1024
    # Reading 32 MB whole would add ~28 MB of text and ~56 MB of ids; streaming adds ~nothing.
    assert peaks[32] - peaks[4] < 16, peaks
