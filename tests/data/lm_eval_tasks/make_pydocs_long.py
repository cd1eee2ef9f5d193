"""Writes pydocs_long.jsonl: the questions of pydocs_mc.jsonl behind a preamble of notes of varying length.

For the reference check of the eval harness (tests/test_eval_e2e.py): the requests vary in length, from shorter to
twice as long as the tiny model's 64-token context, so they exercise packing and lm-eval's left truncation. The
task's context ends in a space (``target_delimiter`` is empty), which lm-eval moves into the continuation.
Deterministic; the JSONL is committed and the tests only read it.
Run: `python tests/data/lm_eval_tasks/make_pydocs_long.py`.
"""

import importlib.util
import json
import pathlib

HERE = pathlib.Path(__file__).parent
ITEMS_USED = 24


def _pydocs_items() -> list:
    spec = importlib.util.spec_from_file_location("make_pydocs_mc", HERE / "make_pydocs_mc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ITEMS


def main() -> None:
    items = _pydocs_items()
    out = HERE / "pydocs_long.jsonl"
    with out.open("w") as f:
        for i, (question, correct, *wrong) in enumerate(items[:ITEMS_USED]):
            # 0 to 7 notes, each a fact from another item: from a few to ~130 tokens of the tiny tokenizer.
            others = [items[(i + k + 1) % len(items)] for k in range(i % 8)]
            notes = " ".join(f"Note: {q} The answer is {a}." for q, a, *_ in others)
            answer = i % 4
            choices = list(wrong)
            choices.insert(answer, correct)
            if i % 3 == 0:  # some longer continuations
                choices = [f"{c}, as the Python documentation says" for c in choices]
            f.write(json.dumps({"notes": notes, "question": question, "choices": choices, "answer": answer}) + "\n")
    print(f"wrote {ITEMS_USED} items to {out}")


if __name__ == "__main__":
    main()
