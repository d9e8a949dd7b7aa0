"""prepare.py gsm8k_chat (gptkit/prepare/gsm8k.py): GSM8K's calculator annotations become
calculator calls in the replies, offline from a GSM8K-format file written here."""

import json

import pytest

from gptkit.data.chat import calculator_call, tool_ids
from gptkit.data.dataset import load_meta
from gptkit.ops.errors import UserError
from gptkit.prepare.gsm8k import gsm8k_messages

import prepare

NATALIA = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
           "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72")


def test_each_annotation_is_a_call_with_the_calculators_output_and_the_text_goes_on():
    assert gsm8k_messages("How many?", NATALIA) == [
        {"role": "user", "content": "How many?"},
        {"role": "assistant", "content": "Natalia sold 48/2 = ", "tool_calls": [calculator_call("48/2")]},
        {"role": "tool", "content": "24"},  # the calculator's own output: what generation will force in
        {"role": "assistant", "content": "24 clips in May.\nNatalia sold 48+24 = ", "tool_calls": [calculator_call("48+24")]},
        {"role": "tool", "content": "72"},
        {"role": "assistant", "content": "72 clips altogether in April and May.\n#### 72"},
    ]
    # an annotation the calculator refuses keeps its result as text; none at all is one plain reply
    assert gsm8k_messages("q", "It is <<x*2=8>>8 now.\n#### 8") == [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "It is 88 now.\n#### 8"}]
    assert gsm8k_messages("q", "Just 5.\n#### 5") == [{"role": "user", "content": "q"},
                                                      {"role": "assistant", "content": "Just 5.\n#### 5"}]


def test_prepare_gsm8k_chat_from_a_local_file(tmp_path, tiktoken_available):
    rows = [{"question": f"Natalia sold clips to {n} friends. How many?", "answer": NATALIA} for n in range(10)]
    source = tmp_path / "train.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert prepare.main(["gsm8k_chat", "--input", str(source), "--data_dir", str(tmp_path / "data")]) == 0
    meta = load_meta(tmp_path / "data", "gsm8k_chat")
    assert meta["chat"]["tool_ids"] == tool_ids(50257) and meta["vocab_size"] == 50257 + 8
    written = [json.loads(line) for line in (tmp_path / "data" / "gsm8k_chat" / "conversations.jsonl").open()]
    assert written[3]["messages"] == gsm8k_messages(rows[3]["question"], NATALIA)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train-00000-of-00001.parquet")  # the Hub's layout
    assert prepare.main(["gsm8k_chat", "--input", str(tmp_path / "train-00000-of-00001.parquet"), "--data_dir",
                         str(tmp_path / "again")]) == 0
    assert load_meta(tmp_path / "again", "gsm8k_chat")["fingerprint"] == meta["fingerprint"]
    (source.parent / "bad.jsonl").write_text('{"question": "q"}\n')
    with pytest.raises(UserError) as e:  # before the folder is touched: the dataset stays as it was
        prepare.main(["gsm8k_chat", "--input", str(source.parent / "bad.jsonl"), "--data_dir", str(tmp_path / "data")])
    assert "bad.jsonl:1: not a GSM8K row" in str(e.value) and "\n" not in str(e.value)
    assert load_meta(tmp_path / "data", "gsm8k_chat") == meta
