"""scripts/pretokenize.py builds the caches a config needs, and training then loads them."""

from tests.helpers.training import run_python, tiny_config


def test_pretokenize_builds_the_caches_training_uses(tmp_path, pydocs_corpus):
    cache_dir = tmp_path / "fresh-cache"
    subset = {}
    for split in ("train", "validation"):  # a slice of the corpus keeps the test quick
        subset[split] = tmp_path / f"{split}.jsonl"
        subset[split].write_text("".join((pydocs_corpus / f"{split}.jsonl").read_text().splitlines(True)[:20]))
    config = tiny_config(tmp_path, pydocs_corpus, "pretok", {"data": {
        "cache_dir": str(cache_dir), "train_urls": [str(subset["train"])], "validation_urls": [str(subset["validation"])],
    }})
    proc = run_python("scripts/pretokenize.py", "--config_path", str(config), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for split in ("train", "validation"):
        assert (cache_dir / split / "shard_ledger.json").exists()
        assert f"{split}: " in proc.stdout
    assert "built serially" in proc.stdout
    again = run_python("scripts/pretokenize.py", "--config_path", str(config), timeout=300)
    assert again.returncode == 0 and "built serially" not in again.stdout, "a second run reuses the caches"


def test_pretokenize_names_missing_data(tmp_path, pydocs_corpus):
    config = tiny_config(tmp_path, pydocs_corpus, "pretok", {"data": {"cache_dir": str(tmp_path / "c"),
                                                                        "train_urls": [str(tmp_path / "nope.jsonl")]}})
    proc = run_python("scripts/pretokenize.py", "--config_path", str(config), timeout=300)
    assert proc.returncode == 2 and "data.train_urls[0]" in proc.stderr
