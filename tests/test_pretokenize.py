"""The data step (``python -m levanter_mars.main.pretokenize``, ``scripts/pretokenize.py``): a dataset id (a
FineWeb-Edu stand-in read as the hub's dataset is) to a verified token cache, held to the cache Levanter's own serial
writer makes from the same config; its resume after kills, its refusals, its dry run; URL sources built serially.

Every build here runs in this process (``cli``) but the Ray build, which runs in a process of its own."""

import hashlib
import json
import os
import signal
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from levanter_mars.main.pretokenize import cli, split_arguments
from levanter_mars.pretokenize.dataset_repo import DatasetRepo
from levanter_mars.pretokenize.standin import SCHEMA
from tests.helpers.first_mile import (
    CONFIG, FIELD, cache_arrays, copy_standin, hub_config, levanter_reference, make_standin, standin_files,
)  # fmt: skip
from tests.helpers.processes import run_python
from tests.helpers.training import tiny_config

SMALL_UNITS = ["--unit_bytes", "150000", "--progress_s", "1"]


@pytest.fixture(scope="module")
def standin(tmp_path_factory, pydocs_corpus):
    folder = tmp_path_factory.mktemp("standin") / "fineweb-edu"
    shape = make_standin(folder, pydocs_corpus)
    return folder, shape


@pytest.fixture(scope="module")
def reference(tmp_path_factory, pydocs_corpus, standin):
    """Levanter's own serial cache of the stand-in's sample-100BT train split."""
    workdir = tmp_path_factory.mktemp("reference")
    config = hub_config(workdir, pydocs_corpus, str(standin[0]))
    return cache_arrays(str(levanter_reference(config, workdir / "levanter-serial" / "train")))


def _split_dir(workdir, cache="cache"):
    return workdir / cache / "fineweb_edu" / "train"


def _record(split_dir):
    return json.loads((split_dir / "build.json").read_text())


# ------------------------------------------------------------------------------------------------- the stand-in


def test_the_standin_has_fineweb_edus_layout_card_and_columns(standin):
    folder, shape = standin
    card = (folder / "README.md").read_text()
    header = yaml.safe_load(card.split("---")[1])
    assert {c["config_name"]: c["data_files"] for c in header["configs"]}[CONFIG] == [
        {"split": "train", "path": "sample/100BT/*"}]
    files = standin_files(folder)
    assert [f.name for f in files] == [f"{i:03d}_00000.parquet" for i in range(4)]
    parquet = pq.ParquetFile(files[0])
    assert parquet.schema_arrow == SCHEMA
    assert SCHEMA.names == ["text", "id", "dump", "url", "file_path", "language", "language_score", "token_count",
                            "score", "int_score"]  # fmt: skip
    assert parquet.metadata.num_row_groups > 1
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    assert rows == shape[CONFIG]["documents"] == 600


def test_a_config_lists_the_files_datasets_streams_in_its_order(standin):
    import datasets

    folder, _ = standin
    listed = DatasetRepo(str(folder), field=FIELD).files(CONFIG, "train")
    builder = datasets.load_dataset_builder(str(folder), name=CONFIG)
    streamed = [os.path.relpath(str(p), str(folder)) for p in builder.config.data_files["train"]]
    assert [f.path for f in listed] == streamed
    assert all(f.size == os.path.getsize(folder / f.path) and f.sha256 is None for f in listed)
    assert DatasetRepo(str(folder), field=FIELD).files(CONFIG, "validation") == []


def test_the_steps_options_and_the_training_overrides_are_told_apart():
    own, training = split_arguments(["--config_path", "x.yaml", "--workers", "2", "--dry_run=true",
                                     "--data.cache_dir", "gs://b/c", "--serial", "true"])  # fmt: skip
    assert own == ["--workers", "2", "--dry_run=true", "--serial", "true"]
    assert training == ["--config_path", "x.yaml", "--data.cache_dir", "gs://b/c"]


# ------------------------------------------------------------------------------------------------- builds


def test_a_serial_build_equals_levanters_own_cache_and_is_recorded(tmp_path, pydocs_corpus, standin, reference,
                                                                   capsys):  # fmt: skip
    from levanter_mars.program_config import parse_train_config
    from levanter_mars.training.data import cache_check

    folder, _ = standin
    config = hub_config(tmp_path, pydocs_corpus, str(folder))
    assert cli(["--config_path", str(config), "--serial", "true", *SMALL_UNITS]) == 0
    out = capsys.readouterr().out
    split_dir = _split_dir(tmp_path)
    offsets, tokens = cache_arrays(str(split_dir))
    assert np.array_equal(offsets, reference[0]) and np.array_equal(tokens, reference[1])
    record = _record(split_dir)
    assert record["units"] > len(standin_files(folder))  # files cut at row groups
    assert record["units_tokenized_now"] == record["units"] and record["units_tokenized_twice"] == []
    assert record["documents"] == 600 and record["tokens"] == len(tokens)
    assert sum(u["tokens"] for u in record["per_unit"]) == len(tokens)
    assert record["versions"]["levanter"] and record["command"].startswith("python")
    verification = json.loads((split_dir / "verification.json").read_text())
    assert [u["first_row"] for u in verification["units"]][:2] == [0, record["per_unit"][0]["rows"]]
    assert verification["sampled_documents"] == 3 * record["units"]
    manifest = json.loads((tmp_path / "cache" / "fineweb_edu" / "mirror" / "mirror.json").read_text())
    for source in standin_files(folder):
        entry = manifest["files"][f"sample/100BT/{source.name}"]
        assert entry["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert not (split_dir / "build" / "units").exists()  # removed once verified
    assert (tmp_path / "cache" / "fineweb_edu" / "validation" / "absent.json").exists()
    check = cache_check.check_caches(parse_train_config(["--config_path", str(config)]).data)
    assert not check.mismatched and not check.unrecorded and str(split_dir) not in check.new
    assert "train (data.configs.fineweb_edu): 600 documents" in out
    again = cli(["--config_path", str(config), "--serial", "true"])
    assert again == 0 and "is finished and verified" in capsys.readouterr().out


def _serial_build_with(prelude: str, config) -> subprocess.CompletedProcess:
    """The data step, serial and in small units, in a fresh interpreter that first runs ``prelude`` (a fault)."""
    code = prelude + "import sys\nfrom levanter_mars.main.pretokenize import cli\nsys.exit(cli(sys.argv[1:]))"
    return run_python("-c", code, "--config_path", str(config), "--serial", "true", *SMALL_UNITS, timeout=300)


def test_a_build_killed_in_the_middle_finishes_without_tokenizing_a_finished_unit_again(tmp_path, pydocs_corpus,
                                                                                      standin, reference):  # fmt: skip
    """The driver killed with -9 just after the third unit's rows went into the cache and before its ledger was
    written (a worker's unit in flight, the assembler ahead of its ledger); then rerun."""
    folder, _ = standin
    config = hub_config(tmp_path, pydocs_corpus, str(folder))
    prelude = ("import os, signal\nimport levanter_mars.pretokenize.assemble as a\n_w = a.write_ledger\n_n = [0]\n"
               "def w(split_dir, ledger):\n    _n[0] += 1\n    if _n[0] == 3:\n        os.kill(os.getpid(), signal.SIGKILL)\n"
               "    _w(split_dir, ledger)\na.write_ledger = w\n")  # fmt: skip
    killed = _serial_build_with(prelude, config)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    split_dir = _split_dir(tmp_path)
    ledger = json.loads((split_dir / "shard_ledger.json").read_text())
    assert len(ledger["finished_shards"]) == 2 and not ledger["is_finished"]
    done_before = {p.parent.name for p in (split_dir / "build" / "units").glob("*/done-*.json")}
    assert len(done_before) == 3
    rerun = run_python("-m", "levanter_mars.main.pretokenize", "--config_path", str(config), "--serial", "true",
                       *SMALL_UNITS, timeout=300)  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "row(s) appended past the ledger by an assembler that was stopped" in rerun.stderr, rerun.stderr[-2000:]
    record = _record(split_dir)
    assert record["units_tokenized_twice"] == []
    assert record["units_tokenized_now"] == record["units"] - 3 and record["units_done_before"] == 3
    offsets, tokens = cache_arrays(str(split_dir))
    assert np.array_equal(offsets, reference[0]) and np.array_equal(tokens, reference[1])


def test_two_ray_workers_build_the_serial_cache(tmp_path, pydocs_corpus, standin, reference):
    folder, _ = standin
    config = hub_config(tmp_path, pydocs_corpus, str(folder))
    proc = run_python("-m", "levanter_mars.main.pretokenize", "--config_path", str(config), "--workers", "2",
                      *SMALL_UNITS, env={"RAY_ADDRESS": ""}, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    offsets, tokens = cache_arrays(str(_split_dir(tmp_path)))
    assert np.array_equal(offsets, reference[0]) and np.array_equal(tokens, reference[1])
    record = _record(_split_dir(tmp_path))
    assert record["workers"] == 2 and "local Ray of 2 worker(s)" in record["executor"]
    assert len({u["host"] for u in record["per_unit"]}) >= 1 and record["units_tokenized_twice"] == []
    assert "units, " in proc.stdout and "M tokens/s (2 worker(s)" in proc.stdout


def test_a_dataset_and_a_cache_in_a_bucket_build_the_same_cache(tmp_path, pydocs_corpus, standin, reference, gs,
                                                                  gcs):  # fmt: skip
    """The stand-in in a bucket (``id: gs://...``: listed, globbed and read through gcsfs), the mirror, the units and
    the cache in a bucket too: the same cache, and a rerun finds it finished."""
    folder, _ = standin
    gs.put(str(folder), gcs.gs("first-mile", "standin").removeprefix("gs://"), recursive=True)
    cache = gcs.gs("first-mile", "cache")
    config = hub_config(tmp_path, pydocs_corpus, gcs.gs("first-mile", "standin"), cache_dir=cache)
    assert cli(["--config_path", str(config), "--serial", "true", *SMALL_UNITS]) == 0
    offsets, tokens = cache_arrays(f"{cache}/fineweb_edu/train")
    assert np.array_equal(offsets, reference[0]) and np.array_equal(tokens, reference[1])
    record = json.loads(gs.cat(f"{cache}/fineweb_edu/train/build.json"))
    assert record["source"]["id"] == gcs.gs("first-mile", "standin") and record["units_tokenized_twice"] == []
    assert not gs.exists(f"{cache}/fineweb_edu/train/build/units")
    assert gs.exists(f"{cache}/fineweb_edu/mirror/sample/100BT/000_00000.parquet")


def test_training_reads_the_finished_cache_and_never_opens_the_dataset(tmp_path, pydocs_corpus, standin):
    """A nano run trained from the built cache, ``datasets.load_dataset`` made to fail: the finished cache is read
    (compat defect 47), the absent validation split is not asked for, the held-out sequences come from the cache."""
    folder, _ = standin
    config = hub_config(tmp_path, pydocs_corpus, str(folder), "fromcache",
                        trainer={"num_train_steps": 6, "steps_per_eval": 3})  # fmt: skip
    assert cli(["--config_path", str(config), "--serial", "true"]) == 0
    poison = "import datasets\ndef _no(*a, **k):\n    raise RuntimeError('the dataset was opened')\n" \
             "datasets.load_dataset = _no\n"  # fmt: skip
    code = poison + "import sys\nfrom levanter_mars.main.train_lm import cli\nsys.exit(cli(sys.argv[1:]))"
    proc = run_python("-c", code, "--config_path", str(config), env={"HF_HUB_OFFLINE": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "runs" / "fromcache" / "metrics.jsonl").open()]
    losses = [m["train/loss"] for m in metrics if "train/loss" in m]
    assert len(losses) == 6 and all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert any("eval/loss" in m for m in metrics)


# ------------------------------------------------------------------------------------------------- refusals


def _no_text(path):
    table = pq.read_table(path).drop(["text"])
    pq.write_table(table, path)


def _empty(path):
    pq.write_table(pa.Table.from_pylist([], schema=SCHEMA), path)


def _corrupt(path):
    path.write_bytes(b"PAR1" + os.urandom(4096))


def _truncated(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("damage, expected", [
    (_no_text, "no column 'text' (data.configs.fineweb_edu.format.text_key); its columns: id, dump"),
    (_empty, "empty (0 documents)"),
    (_corrupt, "not a readable parquet file, corrupt or truncated"),
    (_truncated, "not a readable parquet file, corrupt or truncated"),
])  # fmt: skip
def test_a_bad_source_file_is_refused_naming_it_before_any_unit_is_tokenized(tmp_path, pydocs_corpus, standin,
                                                                            capsys, damage, expected):  # fmt: skip
    folder = copy_standin(standin[0], tmp_path / "broken")
    bad = standin_files(folder)[2]
    damage(bad)
    config = hub_config(tmp_path, pydocs_corpus, str(folder))
    assert cli(["--config_path", str(config), "--serial", "true", *SMALL_UNITS]) == 2
    err = capsys.readouterr().err
    assert f"config error: {tmp_path}/cache/fineweb_edu/mirror/sample/100BT/{bad.name}: {expected}" in err, err
    split_dir = _split_dir(tmp_path)
    assert not (split_dir / "shard_ledger.json").exists() and not list(split_dir.rglob("done-*.json"))


def test_an_unknown_config_name_and_an_unwritable_cache_are_refused_by_field(tmp_path, pydocs_corpus, standin,
                                                                             capsys):  # fmt: skip
    folder, _ = standin
    config = hub_config(tmp_path, pydocs_corpus, str(folder), name="sample-7BT")
    assert cli(["--config_path", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"config error: {FIELD}.name: '{folder}' has no config 'sample-7BT' (its configs: sample-100BT, " \
           "sample-10BT)" in err, err  # fmt: skip
    (tmp_path / "in-the-way").write_text("a file where the cache directory goes")
    config = hub_config(tmp_path, pydocs_corpus, str(folder), cache_dir=str(tmp_path / "in-the-way" / "cache"))
    assert cli(["--config_path", str(config), "--serial", "true"]) == 2
    err = capsys.readouterr().err
    assert "config error: data.cache_dir: cannot write token caches to" in err and "in-the-way" in err, err
    assert (tmp_path / "in-the-way").read_text().startswith("a file")


# ------------------------------------------------------------------------------------------------- dry run


def test_the_dry_run_estimates_and_builds_nothing(tmp_path, pydocs_corpus, standin, capsys):
    folder, _ = standin
    config = hub_config(tmp_path, pydocs_corpus, str(folder))
    assert cli(["--config_path", str(config), "--dry_run", "true", "--estimate_for", "v4-32"]) == 0
    out = capsys.readouterr().out
    assert f"{FIELD}: {folder} (config {CONFIG}, split train)" in out
    assert "files: 4 (sample/100BT/000_00000.parquet ... sample/100BT/003_00000.parquet)" in out
    assert "tokens (estimate): " in out and "on v4-32's 4 host(s) x 240 vCPUs: " in out
    assert f"{FIELD}: no validation files" in out
    assert not (tmp_path / "cache").exists()
    assert cli(["--config_path", str(config), "--dry_run", "true", "--estimate_for", "v9-3"]) == 2
    assert "--estimate_for: " in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------- URL sources


def test_url_sources_are_built_serially_and_training_uses_them(tmp_path, pydocs_corpus):
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
        assert f"{split} (data): 20 documents in {cache_dir / split}" in proc.stdout
    assert "built serially" in proc.stdout
    again = run_python("scripts/pretokenize.py", "--config_path", str(config), timeout=300)
    assert again.returncode == 0 and "built serially" not in again.stdout, "a second run reuses the caches"


def test_pretokenize_names_missing_data(tmp_path, pydocs_corpus):
    config = tiny_config(tmp_path, pydocs_corpus, "pretok", {"data": {"cache_dir": str(tmp_path / "c"),
                                                                        "train_urls": [str(tmp_path / "nope.jsonl")]}})
    proc = run_python("scripts/pretokenize.py", "--config_path", str(config), timeout=300)
    assert proc.returncode == 2 and "data.train_urls[0]" in proc.stderr



def test_a_build_from_files_that_changed_is_refused_or_set_aside_with_rebuild_cache(tmp_path, pydocs_corpus, standin,
                                                                                    capsys):  # fmt: skip
    folder = copy_standin(standin[0], tmp_path / "changing")
    config = hub_config(tmp_path, pydocs_corpus, str(folder))
    assert cli(["--config_path", str(config), "--serial", "true", *SMALL_UNITS]) == 0
    changed = standin_files(folder)[1]
    table = pq.read_table(changed)
    pq.write_table(table.slice(0, table.num_rows - 1), changed)  # a new revision of the dataset: a row fewer
    assert cli(["--config_path", str(config), "--serial", "true"]) == 2
    assert "was planned from other files than" in capsys.readouterr().err
    assert cli(["--config_path", str(config), "--serial", "true", "--data.rebuild_cache", "true"]) == 0
    assert _record(_split_dir(tmp_path))["documents"] == 599
    assert list((tmp_path / "cache" / "fineweb_edu").glob("train.old-*"))  # the first build kept aside


def test_tokens_of_a_unit_from_an_earlier_version_of_a_file_are_never_used(tmp_path, pydocs_corpus, standin):
    """Killed after the first unit was tokenized and before anything reached the cache; the dataset then republishes
    a document of that unit (the same row groups): the rerun tokenizes it again, and the cache holds the new text."""
    folder = copy_standin(standin[0], tmp_path / "republished")
    config = hub_config(tmp_path, pydocs_corpus, str(folder))
    kill = ("import os, signal\nimport levanter_mars.pretokenize.assemble as a\n"
            "a.Assembler.append_ready = lambda self, results: os.kill(os.getpid(), signal.SIGKILL)\n")  # fmt: skip
    code = kill + "import sys\nfrom levanter_mars.main.pretokenize import cli\nsys.exit(cli(sys.argv[1:]))"
    killed = run_python("-c", code, "--config_path", str(config), "--serial", "true", *SMALL_UNITS, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    split_dir = _split_dir(tmp_path)
    assert list((split_dir / "build" / "units").glob("*/done-*.json"))  # the first unit's tokens, now stale
    first = standin_files(folder)[0]
    table = pq.read_table(first)
    texts = table.column("text").to_pylist()
    texts[10] = "A republished document, its text all new. " * 20
    rows = pq.ParquetFile(first).metadata.row_group(0).num_rows
    pq.write_table(table.set_column(0, "text", pa.array(texts)), first, row_group_size=rows)
    assert cli(["--config_path", str(config), "--serial", "true", *SMALL_UNITS]) == 0
    record = _record(split_dir)
    assert record["units_tokenized_now"] == record["units"]
    from levanter_mars.program_config import parse_train_config
    from levanter.data.text import preprocessor_for_format

    data = parse_train_config(["--config_path", str(config)]).data
    processor = preprocessor_for_format(data.configs["fineweb_edu"].format, data.the_tokenizer, enforce_bos=True,
                                        enforce_eos=data.enforce_eos)  # fmt: skip
    offsets, tokens = cache_arrays(str(split_dir))
    row = tokens[offsets[9] : offsets[10]]
    assert row.tolist() == processor([{"text": texts[10]}])[0]["input_ids"]


def test_files_are_listed_in_the_order_datasets_streams_several_patterns(tmp_path):
    """A split of two patterns, the second sorting first, and a hidden file: the order of the card's patterns, each
    sorted, hidden files left out, as ``datasets`` resolves them."""
    import datasets

    from levanter_mars.pretokenize.standin import SCHEMA, _rows

    folder = tmp_path / "two-patterns"
    for sub in ("a", "b"):
        (folder / sub).mkdir(parents=True)
        pq.write_table(pa.Table.from_pydict(_rows([f"from {sub}"], 0, 0), schema=SCHEMA), folder / sub / "x.parquet")
    (folder / "a" / ".x.parquet.crc").write_bytes(b"not data")
    (folder / "README.md").write_text("---\nconfigs:\n- config_name: both\n  data_files:\n  - split: train\n"
                                      "    path: [b/*, a/*]\n---\n")  # fmt: skip
    listed = [f.path for f in DatasetRepo(str(folder), field=FIELD).files("both", "train")]
    streamed = [r["text"] for r in datasets.load_dataset(str(folder), name="both", split="train", streaming=True)]
    assert listed == ["b/x.parquet", "a/x.parquet"] and streamed == ["from b", "from a"]


def test_a_cache_that_fails_its_check_is_cut_back_and_the_rerun_mends_it(tmp_path, pydocs_corpus, standin, reference):
    """A worker writes one wrong token (a host with another tokenizer, say): the check finds it (exit 5, naming the
    unit and row), the cache is cut back and the suspect units' tokens removed; the rerun tokenizes them again."""
    folder, _ = standin
    config = hub_config(tmp_path, pydocs_corpus, str(folder))
    wrong = ("import numpy as np\nimport levanter_mars.pretokenize.worker as w\n_f = w._flush\n"
             "def flush(pending, *rest):\n    if pending:\n        pending[0] = pending[0].copy()\n"
             "        pending[0][1] = (pending[0][1] + 1) % 4000\n    return _f(pending, *rest)\nw._flush = flush\n")  # fmt: skip
    bad = _serial_build_with(wrong, config)
    assert bad.returncode == 5, bad.stderr[-2000:]
    assert "the cache failed its check: unit 00000-00000" in bad.stderr and "which differ from token 1" in bad.stderr
    assert cli(["--config_path", str(config), "--serial", "true", *SMALL_UNITS]) == 0
    offsets, tokens = cache_arrays(str(_split_dir(tmp_path)))
    assert np.array_equal(offsets, reference[0]) and np.array_equal(tokens, reference[1])


def test_a_second_data_step_on_a_source_being_built_is_refused_with_exit_8(tmp_path, pydocs_corpus, standin, capsys):
    from levanter_mars.training.run.lease import RunLease

    folder, _ = standin
    config = hub_config(tmp_path, pydocs_corpus, str(folder))
    held = RunLease.acquire(str(tmp_path / "cache" / "fineweb_edu" / "build.lease.json"), "another data step")
    try:
        assert cli(["--config_path", str(config), "--serial", "true"]) == 8
    finally:
        held.release()
    err = capsys.readouterr().err
    assert "error: the data step of data.configs.fineweb_edu: the run is live elsewhere: pid" in err, err
    assert not (tmp_path / "cache" / "fineweb_edu" / "train" / "shard_ledger.json").exists()
    assert cli(["--config_path", str(config), "--serial", "true"]) == 0
