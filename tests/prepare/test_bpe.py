"""prepare.py --tokenizer bpe: exact round trips (random Unicode, Tiny Shakespeare, a
non-Latin text), merges learned from the training split only, byte-identical
tokenizers, reuse with --tokenizer_from, uint32 bins, and every bad-input error."""

import hashlib
import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from gptkit.data.dataset import load_meta
from gptkit.ops.errors import UserError
from gptkit.prepare import build
from gptkit.prepare.bpe import train_bpe
from gptkit.data.tokenizer import BPETokenizer, tokenizer_from_dict
import prepare


def prepare_bpe(tmp_path, inputs, name="b", **kwargs):
    kwargs.setdefault("vocab_size", 300)
    kwargs.setdefault("workers", 1)
    return build.prepare_dataset([str(p) for p in inputs], "bpe", name, tmp_path / "data", progress=False, **kwargs)


def decoded_splits(folder):
    """(meta as train.py sees it, train text, val text) of a dataset folder."""
    meta = load_meta(folder.parent, folder.name)
    tok = tokenizer_from_dict(meta["tokenizer"])
    ids = [np.fromfile(folder / f"{s}.bin", dtype=meta["dtype"]).tolist() for s in ("train", "val")]
    return meta, tok.decode(ids[0]), tok.decode(ids[1])


def random_unicode(rng, n):
    """Characters from every plane (surrogates excluded: not valid UTF-8), plus combining
    marks, emoji sequences and valid-but-odd code points (NUL, BOM, noncharacters)."""
    odd = ["\x00", "\ufeff", "\ufffe", "\uffff", "\U0010ffff", "\U0001fffe", "\ud7ff", "\ue000", "\u0085", "\u2028"]
    emoji = ["\U0001f600", "\U0001f469\u200d\U0001f4bb", "\U0001f1eb\U0001f1f7", "\u2764\ufe0f", "\U0001f44d\U0001f3fd"]
    combining = ["e\u0301", "a\u0308\u0323", "\u0915\u094d\u0937", "\u1100\u1161\u11a8"]
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.5:
            plane = rng.randrange(17)
            cp = plane << 16 | rng.randrange(1 << 16)
            out.append(chr(cp) if not 0xD800 <= cp <= 0xDFFF else "\U0001f600")
        elif kind < 0.65:
            out.append(rng.choice(odd))
        elif kind < 0.8:
            out.append(rng.choice(emoji))
        elif kind < 0.9:
            out.append(rng.choice(combining))
        else:
            out.append(rng.choice([" ", "  ", "\n", "\t", "the ", "'s ", "123"]))
    return "".join(out)


def non_latin_text(seed=0, n_words=6000):
    """A generated text of Greek, Cyrillic, Devanagari, CJK and Arabic 'words' with punctuation."""
    rng = random.Random(seed)
    alphabets = [
        "αβγδεζηθικλμνξοπρστυφχψω",
        "абвгдежзийклмнопрстуфхцчшщыэюя",
        "कखगघचछजझटठडढणतथदधनपफबभमयरलवशसह",
        "的一是不了人我在有他这中大来上国个到说们为",
        "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    ]
    roots = [
        "".join(rng.choice(alphabets[i % 5]) for _ in range(rng.randrange(2, 7))) for i in range(200)
    ]
    words = []
    for i in range(n_words):
        words.append(rng.choice(roots) + rng.choice(["", "", "ός", "ами", "ों", "。", "،"]))
        words.append(rng.choice([" ", " ", " ", ", ", ". ", "\n", "\n\n"]))
    return "".join(words)


# ---------------------------------------------------------------- exact round trips


def test_random_unicode_round_trips_exactly(shakespeare_path):
    text = shakespeare_path.read_text()[:200_000]
    tok = train_bpe(iter([text]), 400)
    rng = random.Random(0)
    for _ in range(20):
        s = random_unicode(rng, rng.randrange(1, 400))
        ids = tok.encode(s)
        assert tok.decode(ids) == s
        assert 0 <= min(ids) and max(ids) < tok.eot_id  # no unknown tokens, never <|endoftext|>
        assert int(tok.token_byte_lengths()[ids].sum()) == len(s.encode("utf-8"))


def test_random_unicode_corpus_through_prepare_in_small_chunks(tmp_path):
    # Small chunks: the training and the encoding both see many cuts.
    text = random_unicode(random.Random(1), 30_000)
    path = tmp_path / "u.txt"
    path.write_text(text, encoding="utf-8")
    folder = prepare_bpe(tmp_path, [path], vocab_size=400, chunk_chars=1 << 10)
    meta, train, val = decoded_splits(folder)
    n_train = meta["split"]["num_chars"]["train"]
    assert (train, val) == (text[:n_train], text[n_train:])


def test_tiny_shakespeare_round_trips_and_compresses(shakespeare_path, tmp_path):
    folder = prepare_bpe(tmp_path, [shakespeare_path], vocab_size=1024, workers=2, chunk_chars=1 << 15)
    meta, train, val = decoded_splits(folder)
    text = shakespeare_path.read_text()
    n = int(len(text) * 0.9)  # nanoGPT's split
    assert (train, val) == (text[:n], text[n:])
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 1024 and meta["eot_id"] == 1023
    total = sum(meta["num_tokens"].values())
    assert total < len(text) / 2, f"{total} tokens for {len(text)} characters: the merges did nothing"
    # every bin id is inside the vocabulary, and the split's own bytes are what the ids decode to
    tok = tokenizer_from_dict(meta["tokenizer"])
    ids = np.fromfile(folder / "train.bin", dtype=meta["dtype"])
    assert int(tok.token_byte_lengths()[ids].sum()) == len(text[:n].encode("utf-8"))


def test_non_latin_text_round_trips_in_parallel_chunks(tmp_path):
    text = non_latin_text()
    path = tmp_path / "world.txt"
    path.write_text(text, encoding="utf-8")
    one = prepare_bpe(tmp_path, [path], name="one", vocab_size=600)
    two = prepare_bpe(tmp_path, [path], name="two", vocab_size=600, workers=2, chunk_chars=1 << 12)
    meta, train, val = decoded_splits(two)
    n_train = meta["split"]["num_chars"]["train"]
    assert (train, val) == (text[:n_train], text[n_train:])
    # cut in chunks on two workers or whole in one: the same tokenizer and the same bins
    for name in ("tokenizer.json", "train.bin", "val.bin"):
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    assert sum(meta["num_tokens"].values()) < len(text.encode("utf-8")) / 3


def test_documents_are_separated_by_end_of_text(tmp_path):
    docs = [f"document {i}: " + non_latin_text(i, 200) for i in range(10)]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    folder = prepare_bpe(tmp_path, [tmp_path / "docs.jsonl"], vocab_size=400)
    meta = load_meta(folder.parent, folder.name)
    tok = tokenizer_from_dict(meta["tokenizer"])
    train = np.fromfile(folder / "train.bin", dtype=meta["dtype"]).tolist()
    pieces, current = [], []
    for i in train:
        if i == tok.eot_id:
            pieces.append(tok.decode(current))
            current = []
        else:
            current.append(i)
    assert current == [] and len(pieces) == meta["split"]["num_documents"] - meta["split"]["num_val_documents"]
    assert all(p in docs for p in pieces)


# ---------------------------------------------------------------- what the merges depend on


def test_validation_text_never_influences_the_merges(tmp_path):
    train_part = non_latin_text(0, 4000)
    vals = [non_latin_text(seed, 800) for seed in (1, 2)]
    # one document: the same first 90% with a different (equally long) last 10%
    n = len(train_part) * 10 // 9 + 1
    folders = []
    for i, v in enumerate(vals):
        path = tmp_path / f"single{i}.txt"
        path.write_text((train_part + v * 10)[:n], encoding="utf-8")
        folders.append(prepare_bpe(tmp_path, [path], name=f"single{i}", vocab_size=500))
    assert (folders[0] / "val.bin").read_bytes() != (folders[1] / "val.bin").read_bytes()
    assert (folders[0] / "tokenizer.json").read_bytes() == (folders[1] / "tokenizer.json").read_bytes()
    # several documents: the two val documents of ten (meta.json's rule) differ, the train ones do not
    val_docs = [i for i in range(10) if (i + 1) * 2 // 10 > i * 2 // 10]
    jsonl, all_docs = [], []
    for i, v in enumerate(vals):
        docs = [non_latin_text(10 + d, 300) for d in range(10)]
        docs[val_docs[0]], docs[val_docs[1]] = v, v[::-1]
        all_docs.append(docs)
        path = tmp_path / f"docs{i}.jsonl"
        path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
        jsonl.append(prepare_bpe(tmp_path, [path], name=f"docs{i}", vocab_size=500, val_fraction=0.2))
    assert json.loads((jsonl[0] / "meta.json").read_text())["split"]["num_val_documents"] == 2
    assert (jsonl[0] / "tokenizer.json").read_bytes() == (jsonl[1] / "tokenizer.json").read_bytes()
    # and the text of the val documents would have changed the merges had it been seen
    whole = [train_bpe(iter(docs), 500).to_json() for docs in all_docs]
    assert whole[0] != whole[1]


def test_same_corpus_and_settings_give_a_byte_identical_tokenizer(shakespeare_path, tmp_path):
    a = prepare_bpe(tmp_path, [shakespeare_path], name="a", vocab_size=700)
    b = prepare_bpe(tmp_path, [shakespeare_path], name="b", vocab_size=700, chunk_chars=1 << 14)
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    meta = json.loads((a / "meta.json").read_text())
    assert meta["tokenizer"]["sha256"] == hashlib.sha256((a / "tokenizer.json").read_bytes()).hexdigest()


# ---------------------------------------------------------------- reuse, dtype, errors


def test_tokenizer_from_a_dataset_folder_or_a_tokenizer_file(shakespeare_path, tmp_path):
    first = prepare_bpe(tmp_path, [shakespeare_path], name="first", vocab_size=512)
    other = tmp_path / "other.txt"
    other.write_text(non_latin_text(3, 2000), encoding="utf-8")
    for name, source in (("dir", first), ("file", first / "tokenizer.json")):
        folder = prepare_bpe(tmp_path, [other], name=name, vocab_size=None, tokenizer_from=source)
        assert (folder / "tokenizer.json").read_bytes() == (first / "tokenizer.json").read_bytes()
        meta, train, val = decoded_splits(folder)
        assert train + val == other.read_text()


def test_tokenizer_from_refuses_what_is_not_a_regular_file(tmp_path):
    import os

    (tmp_path / "t.txt").write_text("some text " * 50)
    os.mkfifo(tmp_path / "tokenizer.json")  # reading it would block forever
    os.mkfifo(tmp_path / "ckpt.pt")
    for path in (tmp_path / "tokenizer.json", tmp_path / "ckpt.pt"):
        with pytest.raises(UserError, match=rf"--tokenizer_from {path} is a FIFO"):
            prepare_bpe(tmp_path, [tmp_path / "t.txt"], vocab_size=None, tokenizer_from=path)
    folder = tmp_path / "copied"
    folder.mkdir()
    os.mkfifo(folder / "meta.json")
    with pytest.raises(UserError, match=r"meta.json is a FIFO"):
        prepare_bpe(tmp_path, [tmp_path / "t.txt"], vocab_size=None, tokenizer_from=folder)


def test_more_than_65536_ids_use_uint32_bins(tmp_path):
    # A hand-made byte-level vocabulary of 70,000 ids: every byte, every byte pair, and
    # triples "!" + two bytes, of which "!\x01\x02" (one pre-token: punctuation) gets id 66,050.
    tokens = [bytes([i]) for i in range(256)] + [bytes([a, b]) for a in range(256) for b in range(256)]
    tokens += [bytes([33, a, b]) for a in range(256) for b in range(256)][: 70_000 - 1 - len(tokens)]
    tok = BPETokenizer(tokens)
    assert tok.vocab_size == 70_000 and tok.encode("!\x01\x02") == [66_050]
    (tmp_path / "big.json").write_text(tok.to_json(), encoding="ascii")
    text = "x!\x01\x02" * 10 + random_unicode(random.Random(2), 3000)
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    folder = prepare_bpe(tmp_path, [tmp_path / "t.txt"], vocab_size=None, tokenizer_from=tmp_path / "big.json")
    meta, train, val = decoded_splits(folder)
    assert meta["dtype"] == "uint32" and train + val == text
    assert max(np.fromfile(folder / "train.bin", dtype="uint32")) > 65535


def assert_fails(tmp_path, args, message):
    """prepare.main raises a UserError naming the problem and writes nothing under out."""
    out = tmp_path / "out"
    with pytest.raises(UserError, match=message):
        prepare.main([*args, "--out_dir", str(out), "--quiet", "--workers", "1"])
    assert not out.exists() or not any(out.rglob("*")), list(out.rglob("*"))


def test_bad_bpe_settings_are_clear_errors_that_write_nothing(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("a small text, far too small for many merges\n" * 3)
    base = ["--input", str(text), "--tokenizer", "bpe", "--name", "x"]
    assert_fails(tmp_path, [*base, "--vocab_size", "256"], "too small: .* at least 257")
    assert_fails(tmp_path, [*base, "--vocab_size", str((1 << 32) + 1)], "does not fit .* uint32")
    assert_fails(tmp_path, base, "needs exactly one of --vocab_size")
    assert_fails(tmp_path, [*base, "--vocab_size", "5000"], r"too small for --vocab_size 5,000: it gave only \d+ of the 4,743 merges")
    assert_fails(tmp_path, ["--input", str(text), "--tokenizer", "char", "--name", "x", "--vocab_size", "300"], "go with --tokenizer bpe")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_fails(tmp_path, [*base, "--tokenizer_from", str(empty)], "holds no tokenizer")
    assert_fails(tmp_path, [*base, "--tokenizer_from", str(tmp_path / "nope")], "does not exist")
    chars = build.prepare_dataset([str(text)], "char", "c", tmp_path / "chars", workers=1, progress=False)
    assert_fails(tmp_path, [*base, "--tokenizer_from", str(chars)], "holds a char tokenizer, not a BPE")


def test_too_small_corpus_says_how_many_merges_it_learned(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("abcabcabd " * 50)
    with pytest.raises(UserError) as info:
        prepare_bpe(tmp_path, [text], vocab_size=400)
    learned = int(info.value.args[0].split("gave only ")[1].split(" ")[0])
    assert 0 < learned < 143
    assert f"--vocab_size {learned + 257}" in str(info.value)
    folder = prepare_bpe(tmp_path, [text], vocab_size=learned + 257)  # the suggested size works
    assert load_meta(folder.parent, folder.name)["vocab_size"] == learned + 257


def test_a_changed_tokenizer_file_is_refused(shakespeare_path, tmp_path):
    folder = prepare_bpe(tmp_path, [shakespeare_path], vocab_size=300)
    path = folder / "tokenizer.json"
    path.write_text(path.read_text().replace('"he"', '"eh"'))
    with pytest.raises(UserError, match="does not match the sha256 in meta.json"):
        load_meta(folder.parent, folder.name)
    path.unlink()
    with pytest.raises(UserError, match="tokenizer.json is missing"):
        load_meta(folder.parent, folder.name)


def test_cli_exit_code_2_and_one_line(tmp_path):
    import subprocess

    from repo import REPO

    text = tmp_path / "t.txt"
    text.write_text("hello world\n" * 10)
    r = subprocess.run(
        [sys.executable, str(REPO / "prepare.py"), "--input", str(text), "--tokenizer", "bpe", "--vocab_size", "100", "--name", "x", "--out_dir", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr and "at least 257" in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- checkpoints carry the tokenizer


def test_sample_decodes_after_the_dataset_folder_is_deleted(shakespeare_path, tmp_path, capsys):
    import shutil

    import sample
    import train
    from train_helpers import tiny_args

    from gptkit.ops.checkpoint import load_checkpoint

    text = tmp_path / "sh.txt"
    text.write_text(shakespeare_path.read_text()[:100_000])
    folder = prepare_bpe(tmp_path, [text], name="sh", vocab_size=400)
    data_dir, out = tmp_path / "data", tmp_path / "out"
    assert train.main(tiny_args(data_dir, out, dataset="sh", max_iters=4, eval_interval=4)) == 0
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["tokenizer"]["json"] == (folder / "tokenizer.json").read_text()
    # resuming on a dataset with another BPE vocabulary is refused
    prepare_bpe(tmp_path, [text], name="sh", vocab_size=300)
    with pytest.raises(UserError, match="vocabulary mismatch"):
        train.main(tiny_args(data_dir, out, dataset="sh", max_iters=8, init_from="resume"))
    shutil.rmtree(data_dir)
    capsys.readouterr()
    args = ["--out_dir", str(out), "--start", "ROMEO: ", "--max_new_tokens", "30", "--seed", "1", "--num_samples", "1"]
    assert sample.main(args) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("ROMEO: ") and len(printed) > len("ROMEO: ") + 10


PEAK_RSS = """
import sys
from gptkit.prepare import build
# 64 KB strings: rustbpe's buffer (a few strings per core) fills at a few hundred KB, so the
# test sees the steady state at small sizes; prepare.py's ~1 MB strings fill it at a few MB.
build.prepare_dataset([sys.argv[1]], "bpe", "m", sys.argv[2], workers=1, progress=False, vocab_size=400,
                      chunk_chars=1 << 16)
print([line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")][0])  # KiB
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from Linux's /proc")
def test_training_and_encoding_memory_does_not_grow_with_input(shakespeare_path, tmp_path):
    import subprocess

    from repo import REPO

    lines = shakespeare_path.read_text().splitlines(keepends=True)
    peaks = {}
    for mb in (5, 20):  # measured: 76.8 MB at 5 MB, 77.5 at 10 and at 30 (from 70.5 at 2: buffers filling)
        rng, path, written = random.Random(0), tmp_path / f"{mb}.txt", 0
        with open(path, "w") as f:
            while written < mb * 2**20:  # the same words in new orders: only the text grows
                rng.shuffle(lines)
                written += f.write("".join(lines))
        done = subprocess.run(
            [sys.executable, "-c", PEAK_RSS, str(path), str(tmp_path / str(mb))], capture_output=True, text=True, cwd=REPO
        )
        assert done.returncode == 0, done.stderr
        peaks[mb] = int(done.stdout.split()[-1]) / 1024
    # Holding the extra 15 MB of text (let alone rustbpe's copy of it) would add 15 MB or more.
    assert peaks[20] - peaks[5] < 6, peaks


# ---------------------------------------------------------------- an independent implementation


def gpt2_byte_to_char():
    """GPT-2's reversible byte -> printable character map (as Hugging Face's ByteLevel uses)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def merge_pairs(token_bytes):
    """Each learned token's two parts: BPE on its bytes with only the merges learned before it."""
    ranks = {b: i for i, b in enumerate(token_bytes)}
    pairs = []
    for rank in range(256, len(token_bytes)):
        parts = [bytes([b]) for b in token_bytes[rank]]
        while len(parts) > 2:
            best = min(
                (ranks.get(parts[i] + parts[i + 1], rank), i) for i in range(len(parts) - 1)
            )
            assert best[0] < rank, "a token is not a merge of earlier tokens"
            parts[best[1] : best[1] + 2] = [parts[best[1]] + parts[best[1] + 1]]
        pairs.append(tuple(parts))
    return pairs


def test_encoding_matches_hugging_face_bpe_with_the_same_merges(shakespeare_path):
    tokenizers = pytest.importorskip("tokenizers")
    text = shakespeare_path.read_text()
    ours = train_bpe(iter([text[:500_000]]), 1000)
    to_char = gpt2_byte_to_char()
    spell = lambda b: "".join(to_char[x] for x in b)  # noqa: E731
    vocab = {spell(b): i for i, b in enumerate(ours.token_bytes)}
    merges = [(spell(a), spell(b)) for a, b in merge_pairs(ours.token_bytes)]
    hf = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=merges))
    hf.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    for sample in (text[500_000:600_000], non_latin_text(5, 3000), random_unicode(random.Random(3), 2000)):
        assert ours.encode(sample) == hf.encode(sample, add_special_tokens=False).ids
