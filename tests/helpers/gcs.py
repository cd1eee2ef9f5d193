"""A local GCS for tests: gcp-storage-emulator on 127.0.0.1, in memory, served from a thread of the test process.

Clients reach it through the two standard variables only (``STORAGE_EMULATOR_HOST`` for gcsfs,
``TENSORSTORE_GCS_HTTP_URL`` for tensorstore), with anonymous access; product code knows nothing about it.

Four gaps of the emulator are filled here, as real GCS behaves:

* preconditions are ignored: ``ifGenerationMatch`` on an upload, a download or a delete (the run's lease creates with
  ``ifGenerationMatch=0`` and replaces and releases with the generation it read, ``training/run/lease_store.py``) is
  honoured here, with GCS's 412 when it does not hold; each request is served alone (the server has one thread), so
  the check and the write are one step, as on GCS;
* listings ignore ``startOffset``/``endOffset``, so tensorstore's ``delete_existing`` of one array (listing its key
  range, then deleting what is listed) deletes its sibling arrays' objects too (a token cache lost its
  ``offsets/zarr.json``);

tensorstore needs the other two to read the index of a sharded array, as every token cache is:

* a suffix byte range (``Range: bytes=-N``, the last N bytes, RFC 9110) is answered with the whole object, which
  tensorstore rejects ("Requested byte range [-8196, ?) was ignored by server");
* no ``x-goog-generation`` header is sent, which tensorstore's sharded reader rejects ("Malformed
  StorageGeneration").

And one cost: after every object it creates or deletes, the emulator writes its whole metadata (every object of
every bucket) as indented JSON, through Python's pure-Python encoder, even in memory where nothing reads it back. The
cost grows with the square of the objects (3,000 writes took 59 CPU-s, on the thread that serves every request);
the session's emulator skips it.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from http import HTTPStatus, server
from typing import Iterator

from gcp_storage_emulator import server as emulator_server
from gcp_storage_emulator.handlers import buckets, objects
from gcp_storage_emulator.storage import Storage

BUCKET = "levanter-mars-test"
_SUFFIX_RANGE = re.compile(r"\s*bytes=-(?P<length>[0-9]+)\s*")


def _as_gcs_downloads(download):
    """Rewrites ``bytes=-N`` as the equivalent ``bytes=START-`` before the emulator's own download handler runs,
    and sends the object's generation with its bytes."""

    def gcs_download(request, response, storage, *args, **kwargs):
        try:
            obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        except Exception:  # noqa: BLE001 - a missing object: the emulator's handler answers 404
            obj = None
        match = _SUFFIX_RANGE.fullmatch(request.get_header("range", "") or "")
        if obj is not None and match and int(match["length"]) > 0:
            start = max(0, int(obj["size"]) - int(match["length"]))
            request._request_handler.headers.replace_header("Range", f"bytes={start}-")
        if obj is not None:
            response["x-goog-generation"] = str(obj["generation"])
            response["x-goog-metageneration"] = str(obj.get("metageneration", "1"))
        return download(request, response, storage, *args, **kwargs)

    return gcs_download


def _with_key_ranges(ls):
    """Keeps only the names in [startOffset, endOffset) of a listing, as GCS does."""

    def gcs_ls(request, response, storage, *args, **kwargs):
        result = ls(request, response, storage, *args, **kwargs)
        start = (request.query.get("startOffset") or [""])[0]
        end = (request.query.get("endOffset") or [None])[0]
        if (start or end) and response.status == HTTPStatus.OK:
            listing = json.loads(response._content)

            def within(name):
                return name >= start and (end is None or name < end)

            listing["items"] = [item for item in listing.get("items") or [] if within(item["name"])]
            listing["prefixes"] = [prefix for prefix in listing.get("prefixes") or [] if within(prefix)]
            response.json(listing)
        return result

    return gcs_ls


def _upload_name(request):
    if "name" in request.query:
        return request.query["name"][0]
    data = request.data  # parsed once and kept: the emulator's handler reads the same
    if isinstance(data, dict):
        meta = data.get("meta") if isinstance(data.get("meta"), dict) else data
        return meta.get("name")
    return None


def _with_preconditions(handler, name_of):
    """Answers 412 before ``handler`` runs when ``ifGenerationMatch`` does not hold (0: the object must not exist)."""

    def gcs_handler(request, response, storage, *args, **kwargs):
        wanted = (request.query.get("ifGenerationMatch") or [None])[0]
        if wanted is not None:
            try:
                current = str(storage.get_file_obj(request.params["bucket_name"], name_of(request))["generation"])
            except Exception:  # noqa: BLE001 - no such object (NotFound): generation 0
                current = "0"
            if current != str(int(wanted)):
                response.status = HTTPStatus.PRECONDITION_FAILED
                response.json({"error": {"code": 412, "message": "At least one of the pre-conditions you specified "
                                         "did not hold.", "errors": [{"reason": "conditionNotMet"}]}})  # fmt: skip
                return None
        return handler(request, response, storage, *args, **kwargs)

    return gcs_handler


def _object_name(request):
    return request.params["object_id"]


@contextmanager
def _patched_handlers() -> Iterator[None]:
    patches = {
        objects.download: _with_preconditions(_as_gcs_downloads(objects.download), _object_name),
        objects.ls: _with_key_ranges(objects.ls),
        objects.insert: _with_preconditions(objects.insert, _upload_name),
        objects.delete: _with_preconditions(objects.delete, _object_name),
    }
    routes = [handlers for _, handlers in emulator_server.HANDLERS if set(patches) & set(handlers.values())]

    def install(replacements):
        for handlers in routes:
            for method, handler in handlers.items():
                handlers[method] = replacements.get(handler, handler)
        # objects.get(alt=media) calls download by its module-level name
        objects.download = replacements.get(objects.download, objects.download)
        objects.ls = replacements.get(objects.ls, objects.ls)
        objects.insert = replacements.get(objects.insert, objects.insert)
        objects.delete = replacements.get(objects.delete, objects.delete)

    install(patches)
    try:
        yield
    finally:
        install({patched: original for original, patched in patches.items()})


class _CountingHandler(emulator_server.RequestHandler):
    def parse_request(self):
        ok = super().parse_request()
        if ok:
            self.server.requests[self.command] += 1
        return ok


class _Server(server.HTTPServer):
    request_queue_size = 256  # tensorstore opens many connections at once; the emulator serves them one by one


# The override below names a private method: were it renamed, the override would do nothing, silently.
assert hasattr(Storage, "_write_config_to_file"), "gcp-storage-emulator no longer has Storage._write_config_to_file"


class _MemoryStorage(Storage):
    """The emulator's in-memory storage without its metadata file (the module docstring's cost)."""

    def __init__(self) -> None:
        super().__init__(use_memory_fs=True)

    def _write_config_to_file(self) -> None:
        pass


@dataclass
class GcsEmulator:
    url: str
    bucket: str
    storage: Storage
    requests: Counter = field(default_factory=Counter)
    """HTTP requests served, by method (reset it to measure one operation)."""

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to use this emulator instead of GCS."""
        return {"STORAGE_EMULATOR_HOST": self.url, "TENSORSTORE_GCS_HTTP_URL": self.url}

    def gs(self, *parts: str) -> str:
        return "gs://" + "/".join([self.bucket, *(p.strip("/") for p in parts)])


@contextmanager
def gcs_emulator(bucket: str = BUCKET) -> Iterator[GcsEmulator]:
    storage = _MemoryStorage()
    buckets.create_bucket(bucket, storage)
    with _patched_handlers():
        # Port 0: the server binds a port itself and says which (server_address), so no other process can take it.
        httpd = _Server(("127.0.0.1", 0), partial(_CountingHandler, storage))
        httpd.requests = Counter()
        thread = threading.Thread(target=httpd.serve_forever, name="gcs-emulator", daemon=True)
        thread.start()
        try:
            host, port = httpd.server_address
            yield GcsEmulator(f"http://{host}:{port}", bucket, storage, httpd.requests)
        finally:
            httpd.shutdown()
            httpd.server_close()
            thread.join(timeout=10)
