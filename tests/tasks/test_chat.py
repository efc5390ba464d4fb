"""TRL's standard and conversational dataset formats, and chat templates applied by real tokenizers."""

from __future__ import annotations

import json

import pytest

from chat_helpers import BOS_TEMPLATE, CHATML, fast_tokenizer
from lmpo.errors import InputError
from lmpo.models import CharTokenizer
from lmpo.tasks import Example, load_file_task, render_prompts, rows_to_examples, task_from_rows

SYSTEM = {"role": "system", "content": "Answer with a number."}
CONV_ROWS = [{"prompt": [SYSTEM, {"role": "user", "content": f"{i}+{i}="}], "answer": str(2 * i), "level": i % 2}
             for i in range(20)]
# TRL's conversational prompt-completion rows: the reference is the assistant message
PC_ROWS = [{"prompt": [{"role": "user", "content": f"{i}*3="}], "completion": [{"role": "assistant",
                                                                                 "content": str(3 * i)}]}
           for i in range(10)]


def test_conversational_rows_keep_their_messages_until_rendered():
    ex = rows_to_examples(CONV_ROWS)[3]
    assert ex.prompt == "" and ex.messages == CONV_ROWS[3]["prompt"]
    assert ex.answer == "6" and ex.meta == {"level": 1}
    pc = rows_to_examples(PC_ROWS)[4]
    assert pc.answer == "12" and pc.meta == {} and pc.messages == [{"role": "user", "content": "4*3="}]
    std = rows_to_examples([{"prompt": "2+2=", "completion": "4", "source": "x"}])[0]
    assert std == Example("2+2=", "4", {"source": "x"})


def test_chatml_rendering_matches_the_tokenizers_own_encoding():
    tok = fast_tokenizer(CHATML)
    [ex] = render_prompts(rows_to_examples(CONV_ROWS[2:3]), tok)
    assert ex.prompt == ("<|im_start|>system\nAnswer with a number.<|im_end|>\n<|im_start|>user\n2+2=<|im_end|>\n"
                         "<|im_start|>assistant\n")
    assert ex.messages == CONV_ROWS[2]["prompt"]
    # what the rollout engine encodes is exactly what apply_chat_template(tokenize=True) gives
    expected = tok.apply_chat_template(ex.messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert tok(ex.prompt)["input_ids"] == expected


def test_a_template_writing_bos_is_not_doubled_by_a_tokenizer_that_adds_bos():
    tok = CharTokenizer()  # prepends <bos> when encoding
    tok.chat_template = BOS_TEMPLATE
    [ex] = render_prompts([Example("", "4", messages=[{"role": "user", "content": "2+2="}])], tok)
    assert ex.prompt == "[user]2+2=\n[assistant]"
    ids = tok(ex.prompt)["input_ids"]
    assert ids.count(tok.bos_token_id) == 1
    assert ids == tok.apply_chat_template(ex.messages, add_generation_prompt=True, tokenize=True)["input_ids"]


def test_prompt_formats():
    tok = fast_tokenizer(CHATML)
    plain = [Example("2+2=", "4")]
    assert render_prompts(plain, tok, "auto") == plain  # TRL: string prompts are used as they are
    [chat] = render_prompts(plain, tok, "chat")
    assert chat.prompt == "<|im_start|>user\n2+2=<|im_end|>\n<|im_start|>assistant\n"
    assert chat.messages == [{"role": "user", "content": "2+2="}]
    with pytest.raises(InputError, match="prompt_format"):
        render_prompts(rows_to_examples(CONV_ROWS[:1]), tok, "text")
    with pytest.raises(InputError, match="auto, chat, text"):
        render_prompts(plain, tok, "jinja")


def test_tokenizer_without_template_is_an_input_error_naming_the_fix():
    tok = fast_tokenizer(chat_template=None)
    with pytest.raises(InputError) as err:
        render_prompts(rows_to_examples(CONV_ROWS[:2]), tok, model_name="model 'tiny-base'",
                       source="task 'chat.jsonl'")
    msg = str(err.value)
    assert "'chat.jsonl'" in msg and "'tiny-base'" in msg and "no chat template" in msg
    assert "task.chat_template" in msg and "plain-text prompts" in msg
    # the fix works: a template given in the config (as text or as a file) renders the prompts
    [ex] = render_prompts(rows_to_examples(CONV_ROWS[:1]), tok, chat_template=CHATML)
    assert ex.prompt.startswith("<|im_start|>system\n")


def test_chat_template_from_a_file(tmp_path):
    path = tmp_path / "chat.jinja"
    path.write_text(CHATML)
    [ex] = render_prompts([Example("1+1=", "2")], fast_tokenizer(None), "chat", str(path))
    assert ex.prompt == "<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(InputError, match="neither a Jinja template"):
        render_prompts([Example("1+1=", "2")], fast_tokenizer(None), "chat", str(tmp_path / "missing.jinja"))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_conversational_files_split_by_conversation(tmp_path, fmt):
    path = tmp_path / f"chat.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in CONV_ROWS))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(CONV_ROWS), path)
    task = load_file_task(str(path), eval_fraction=0.25)
    train, held = task.train_examples(), task.eval_examples()
    # every prompt is "" before rendering: the split must tell the conversations apart
    assert len(train) == 15 and len(held) == 5
    users = {e.messages[-1]["content"] for e in train} | {e.messages[-1]["content"] for e in held}
    assert len(users) == 20


def test_datasets_object_with_conversational_prompts():
    datasets = pytest.importorskip("datasets")
    train = datasets.Dataset.from_list(PC_ROWS[:8])
    test = datasets.Dataset.from_list(PC_ROWS[8:])
    task = task_from_rows(train, test, name="pc")
    assert [e.answer for e in task.eval_examples()] == ["24", "27"]
    rendered = render_prompts(task.train_examples(), fast_tokenizer(CHATML))
    assert rendered[1].prompt == "<|im_start|>user\n1*3=<|im_end|>\n<|im_start|>assistant\n"
