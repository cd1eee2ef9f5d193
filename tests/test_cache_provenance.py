"""A token cache trains only the data and tokenizer it was built from (issue 13), checked through the CLI.

Each test gets its own copy of a slice of the embedded corpus and a cache built by the data step
(``levanter_mars.main.pretokenize.run``, in this process: a second or two); only the tests that must train run the CLI as a subprocess.
"""

import json
import os
from pathlib import Path

import pytest

from levanter_mars.main import pretokenize
from levanter_mars.training.data import cache_check
from levanter_mars.training.data import pydocs_corpus as corpus_lib
from levanter_mars.training.config import parse_config
from levanter_mars.training.data.provenance import RECORD_FILE
from tests.helpers import training as cli

_LINES = {"train": 60, "validation": 37}
_REFUSAL = "were built from other data than this config names"
_UNRECORDED = "has no provenance record"


def _pretokenized(workdir: Path, corpus: Path) -> dict:
    """A slice of the corpus under ``workdir/data``, tokenized by the data step into ``workdir/tokenized``.
    Returns the config's data section."""
    (workdir / "data").mkdir(parents=True)
    for split, lines in _LINES.items():
        text = "".join((corpus / f"{split}.jsonl").read_text().splitlines(True)[:lines])
        (workdir / "data" / f"{split}.jsonl").write_text(text)
    data = {
        "train_urls": [str(workdir / "data" / "train.jsonl")],
        "validation_urls": [str(workdir / "data" / "validation.jsonl")],
        "cache_dir": str(workdir / "tokenized"),
    }
    config = cli.tiny_config(workdir, corpus, "pretokenize", {"data": data})
    assert pretokenize.run(["--config_path", str(config)], report=lambda line: None) == 0
    return data


def _record(workdir: Path, split: str = "train", name: str = "tokenized") -> dict:
    return json.loads((workdir / name / split / RECORD_FILE).read_text())


def _rows(cache: Path) -> int:
    return json.loads((cache / "shard_ledger.json").read_text())["total_num_rows"]


@pytest.fixture
def pretokenized(tmp_path, pydocs_corpus):
    return tmp_path, _pretokenized(tmp_path, pydocs_corpus)


def _refused(capsys, workdir, corpus, data) -> str:
    before = {split: _record(workdir, split) for split in _LINES}
    code, out = cli.run_cli_in_process(capsys, cli.tiny_config(workdir, corpus, "refused", {"data": data}))
    assert code == 2, out[-3000:]
    for part in (_REFUSAL, f"data.cache_dir={workdir / 'tokenized'}", "set data.cache_dir to a new directory",
                 "--data.rebuild_cache true", "moved aside (kept, never deleted), a new one is built"):
        assert part in out, out[-3000:]
    assert not cli.run_paths(workdir, "refused")["metrics"].exists()
    assert {split: _record(workdir, split) for split in _LINES} == before, "a refusal changes nothing"
    return out


def test_pretokenize_records_what_each_cache_is_built_from(pretokenized, pydocs_corpus):
    workdir, data = pretokenized
    for split in _LINES:
        record = _record(workdir, split)
        path = workdir / "data" / f"{split}.jsonl"
        assert record["source"] == {"urls": [str(path)]}
        assert record["files"][str(path)]["size"] == path.stat().st_size
        assert record["tokenizer"]["name"] == str(pydocs_corpus / "tokenizer")
        assert record["tokenizer"]["vocab_size"] == corpus_lib.VOCAB_SIZE
        assert record["preprocessing"]["append_eos"] is True and record["preprocessing"]["format"]["type"] == "text"
        assert _rows(workdir / "tokenized" / split) == _LINES[split]


def test_changed_urls_are_refused_naming_the_field(pretokenized, pydocs_corpus, capsys):
    workdir, data = pretokenized
    other = workdir / "data" / "validation.jsonl"
    out = _refused(capsys, workdir, pydocs_corpus, {**data, "train_urls": [str(other)]})
    assert f'data.train_urls: ["{data["train_urls"][0]}"] -> ["{other}"]' in out, out[-3000:]
    assert "validation (recorded" not in out, "the validation cache still matches"


def test_changed_tokenizer_is_refused(pretokenized, pydocs_corpus, capsys):
    workdir, data = pretokenized
    texts = [json.loads(line)["text"] for line in (workdir / "data" / "validation.jsonl").read_text().splitlines()]
    corpus_lib.train_tokenizer(texts, workdir / "other-tokenizer", vocab_size=400)
    out = _refused(capsys, workdir, pydocs_corpus, {**data, "tokenizer": str(workdir / "other-tokenizer")})
    assert f"data.tokenizer: {pydocs_corpus / 'tokenizer'} (4096 tokens" in out, out[-3000:]
    assert f"-> {workdir / 'other-tokenizer'} (400 tokens" in out, out[-3000:]


def test_changed_file_size_behind_the_same_url_is_refused(pretokenized, pydocs_corpus, capsys):
    workdir, data = pretokenized
    train = workdir / "data" / "train.jsonl"
    size = train.stat().st_size
    with train.open("a") as f:
        f.write(json.dumps({"text": "one more document"}) + "\n")
    out = _refused(capsys, workdir, pydocs_corpus, data)
    assert f"data.train_urls file {train}: size: {size} -> {train.stat().st_size}" in out, out[-3000:]


def test_a_touched_file_matches_and_a_same_size_rewrite_does_not(pretokenized, pydocs_corpus):
    """The recorded checksum decides when only the mtime changed: a copy or `touch` is not a change."""
    workdir, data = pretokenized
    parsed = parse_config(["--config_path", str(cli.tiny_config(workdir, pydocs_corpus, "touch", {"data": data}))])
    train = workdir / "data" / "train.jsonl"
    os.utime(train, ns=(1, 1))
    check = cache_check.check_caches(parsed.data)
    assert not check.mismatched and not check.warnings and not check.unrecorded
    text = train.read_text()
    train.write_text(text.replace("a", "b", 1))  # same size, other content
    assert train.stat().st_size == len(text.encode())
    check = cache_check.check_caches(parsed.data)
    (found,) = check.mismatched[str(workdir / "tokenized" / "train")]
    assert found.field == f"data.train_urls file {train}: content"
    assert cache_check.CacheCheck.from_json(check.to_json()) == check  # what process 0 broadcasts to the others


def test_missing_file_alone_is_a_warning(pretokenized, pydocs_corpus, caplog):
    workdir, data = pretokenized
    parsed = parse_config(["--config_path", str(cli.tiny_config(workdir, pydocs_corpus, "gone", {"data": data}))])
    (workdir / "data" / "train.jsonl").unlink()
    check = cache_check.check_caches(parsed.data)
    assert not check.mismatched and len(check.warnings) == 1 and "train.jsonl: missing" in check.warnings[0]
    other = cli.tiny_config(workdir, pydocs_corpus, "gone2", {"data": {**data, "enforce_eos": False}})
    found = cache_check.check_caches(parse_config(["--config_path", str(other)]).data).mismatched
    fields = [d.field for d in found[str(workdir / "tokenized" / "train")]]
    assert "data.enforce_eos" in fields and any(f.endswith("train.jsonl") for f in fields), fields


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory, pydocs_corpus):
    """A cache built from train.jsonl, then a run on other train URLs with data.rebuild_cache: true."""
    workdir = tmp_path_factory.mktemp("rebuild")
    data = _pretokenized(workdir, pydocs_corpus)
    data = {**data, "train_urls": [str(workdir / "data" / "validation.jsonl")], "rebuild_cache": True}
    config = cli.tiny_config(workdir, pydocs_corpus, "rebuilt", {"data": data})
    proc = cli.run_cli(config)
    assert proc.returncode == 0, cli.describe_failure(proc)
    return workdir, data, proc


@pytest.mark.slow
def test_rebuild_cache_builds_a_new_cache_and_keeps_the_old_aside(rebuilt):
    workdir, data, proc = rebuilt
    (old,) = (workdir / "tokenized").glob("train.old-*")
    assert f"moved the token cache {workdir / 'tokenized' / 'train'} to {old}" in cli.output(proc)
    assert json.loads((old / RECORD_FILE).read_text())["source"]["urls"] == [str(workdir / "data" / "train.jsonl")]
    assert _rows(old) == _LINES["train"]
    assert _record(workdir)["source"]["urls"] == data["train_urls"]
    assert _rows(workdir / "tokenized" / "train") == _LINES["validation"]  # the new cache holds the new documents
    assert not list((workdir / "tokenized").glob("validation.old-*")), "a matching cache is kept"
    assert cli.run_paths(workdir, "rebuilt")["metrics"].exists()


@pytest.mark.slow
def test_identical_rerun_gives_no_message_and_the_same_losses(rebuilt, pydocs_corpus):
    """The same command again (another run id, so it trains rather than resumes); rebuild_cache is still true, as
    in a restarted job, and must not rebuild again."""
    workdir, data, first = rebuilt
    proc = cli.run_cli(cli.tiny_config(workdir, pydocs_corpus, "rerun", {"data": data}))
    assert proc.returncode == 0, cli.describe_failure(proc)
    for message in (_REFUSAL, _UNRECORDED, "moved the token cache", "provenance"):
        assert message not in cli.output(proc)
    assert len(list((workdir / "tokenized").glob("train.old-*"))) == 1
    expected = cli.losses(cli.run_paths(workdir, "rebuilt")["metrics"])
    assert len(expected) == 30 and cli.losses(cli.run_paths(workdir, "rerun")["metrics"]) == expected


@pytest.mark.slow
def test_record_less_cache_is_used_with_a_warning(pretokenized, pydocs_corpus):
    workdir, data = pretokenized
    for split in _LINES:  # as a cache built before records existed, or by plain Levanter, would be
        (workdir / "tokenized" / split / RECORD_FILE).unlink()
    proc = cli.run_cli(cli.tiny_config(workdir, pydocs_corpus, "unrecorded", {"data": data}))
    assert proc.returncode == 0, cli.describe_failure(proc)
    for split in _LINES:
        assert f"Token cache {workdir / 'tokenized' / split} {_UNRECORDED}" in cli.output(proc)
        assert not (workdir / "tokenized" / split / RECORD_FILE).exists(), "no record is made up for it"
    assert "sources cannot be checked" in cli.output(proc)
    assert len(cli.losses(cli.run_paths(workdir, "unrecorded")["metrics"])) == 30
