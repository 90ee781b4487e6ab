"""xdist workers share one Triton cache directory (ssd_pytest/workers.py, pin_worker). That is safe because
Triton's FileCacheManager publishes every file with an atomic os.replace from a private temp dir: concurrent writers
of the same entry and a concurrent reader never see a partial file. Shown here with real processes, and the reader's
check shown to catch a writer that is not atomic."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

PAYLOAD_BYTES = 1 << 20
WRITERS = 4
ROUNDS = 20
KEY, NAME = "shared-key", "kernel.cubin"


def _triton_writer(cache_dir: str, tag: int) -> None:
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    from triton.runtime.cache import FileCacheManager

    manager = FileCacheManager(KEY)
    for i in range(ROUNDS):
        manager.put(bytes([(tag * ROUNDS + i) % 251]) * PAYLOAD_BYTES, NAME, binary=True)


def _naive_writer(cache_dir: str, tag: int) -> None:
    """Writes the final path in place, in two halves: what a cache without atomic publish would do."""
    folder = os.path.join(cache_dir, KEY)
    os.makedirs(folder, exist_ok=True)
    for i in range(ROUNDS):
        with open(os.path.join(folder, NAME), "wb") as fh:
            fh.write(bytes([(tag + i) % 251]) * (PAYLOAD_BYTES // 2))
            fh.flush()
            time.sleep(0.02)
            fh.write(bytes([(tag + i) % 251]) * (PAYLOAD_BYTES // 2))


def read_while_writing(cache_dir: str, writer) -> int:
    """Start the writers, read the entry until they finish; assert every read is a whole, single-writer file."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=writer, args=(cache_dir, t)) for t in range(WRITERS)]
    for p in procs:
        p.start()
    path = os.path.join(cache_dir, KEY, NAME)
    seen = 0
    try:
        while any(p.is_alive() for p in procs):
            if os.path.exists(path):
                data = open(path, "rb").read()
                assert len(data) == PAYLOAD_BYTES, f"partial file: {len(data)} bytes"
                assert data == data[:1] * PAYLOAD_BYTES, "a file mixing two writers' bytes"
                seen += 1
    finally:
        for p in procs:
            p.join()
    assert all(p.exitcode == 0 for p in procs)
    return seen


def test_concurrent_triton_writers_never_expose_a_partial_file(tmp_path):
    pytest.importorskip("triton.runtime.cache")
    seen = read_while_writing(str(tmp_path), _triton_writer)
    leftovers = [n for n in os.listdir(tmp_path / KEY) if n.startswith("tmp.")]
    assert not leftovers, leftovers
    assert seen > 0, "the reader never saw the entry while the writers ran"


def test_the_reader_catches_a_non_atomic_writer(tmp_path):
    with pytest.raises(AssertionError, match="partial file|mixing"):
        read_while_writing(str(tmp_path), _naive_writer)
