"""The background writer: the same store as synchronous writes, bounded queue memory, errors
surfaced in the caller, and Ctrl-C committing what was already captured."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import store_drill
from support.stores import assert_same_store
from workbench.store import StoreError, StoreWriter, Variable, open_store
from workbench.writer import COMMIT_SHARE, BackgroundWriter, captured_bytes


def drill_results():
    for s, (sample, n) in enumerate(store_drill.SAMPLES):
        for c, (name, sweep) in enumerate(store_drill.CONDITIONS.items()):
            yield name, sample, store_drill.sample_variables(c, s, n), {"sweep": sweep, "identity": store_drill.identity(sweep)}, f"input-{s}"


def write_in_background(path, max_bytes=1 << 30, **kwargs):
    with StoreWriter(path) as store:
        store.ensure_model(store_drill.MODEL, {"family": "drill", "n_layers": 2, "hidden_size": 128,
                                               "dtype": "float32", "device": "cpu"})
        store.add_provenance({"spec_name": "drill"})
        with BackgroundWriter(store, max_bytes=max_bytes, **kwargs) as writer:
            for name, sample, variables, attrs, input_hash in drill_results():
                writer.put(store_drill.MODEL, name, sample, variables, attrs, input_hash)
        store.finish_run()
    return writer


def test_background_writes_give_the_synchronous_store(tmp_path):
    reference = tmp_path / "sync.zarr"
    assert store_drill.run(str(reference)) == 0
    written = []
    writer = write_in_background(tmp_path / "bg.zarr", on_written=lambda *key: written.append(key))
    assert len(written) == 4 and writer.queued_bytes == 0
    assert_same_store(tmp_path / "bg.zarr", reference, (store_drill.MODEL,))


def test_the_queue_is_bounded_in_bytes(tmp_path):
    one = max(captured_bytes(v) for _, _, v, _, _ in drill_results())
    writer = write_in_background(tmp_path / "bg.zarr", max_bytes=one + 1)
    assert one <= writer.peak_bytes <= one + 1  # never two results queued at once


def test_an_error_in_the_thread_reaches_the_caller_and_nothing_after_it_is_written(tmp_path):
    with StoreWriter(tmp_path / "bg.zarr") as store:
        store.ensure_model("m", {"family": "x"})
        bad = {"position": Variable(("token",), np.arange(3)), "hidden": Variable(("token", "dim"), np.zeros((4, 2)))}
        good = {"position": Variable(("token",), np.arange(3)), "hidden": Variable(("token", "dim"), np.zeros((3, 2)))}
        with pytest.raises(StoreError, match="disagree on the number of tokens"):
            with BackgroundWriter(store) as writer:
                writer.put("m", "c", "s0", good)
                writer.put("m", "c", "s1", bad)
                writer.put("m", "c", "s2", good)
    assert [str(s) for s in open_store(tmp_path / "bg.zarr", model="m").run_sample.values] == ["s0"]


def test_an_interrupt_commits_what_was_captured(tmp_path):
    """Ctrl-C in the caller (here raised right after the last put): the context manager still
    writes every queued result before the interrupt propagates."""
    gate = threading.Event()
    with StoreWriter(tmp_path / "bg.zarr") as store:
        store.ensure_model(store_drill.MODEL, {"family": "drill"})
        with pytest.raises(KeyboardInterrupt):
            with BackgroundWriter(store, on_written=lambda *key: gate.wait(5)) as writer:
                for name, sample, variables, attrs, input_hash in drill_results():
                    writer.put(store_drill.MODEL, name, sample, variables, attrs, input_hash)
                gate.set()
                raise KeyboardInterrupt
    assert len(open_store(tmp_path / "bg.zarr", model=store_drill.MODEL).run_sample) == 4


def store_commits(path):
    """Commits that hold results (not the repository's first, empty one, nor the run end's copy)."""
    from workbench.store import RUN_END, store_history

    return [h for h in store_history(path)
            if h["message"] != "Repository initialized" and not h["message"].endswith(RUN_END.format(""))]


def test_results_within_the_commit_interval_are_one_commit_equal_to_per_result_commits(tmp_path, monkeypatch):
    """Gathered commits: the whole drill arrives within the interval, so it is ONE commit holding
    four results (two conditions x two samples, each condition appended as one block), and the
    store equals the synchronous one, a commit per result."""
    monkeypatch.setenv("WORKBENCH_COMPACT_GRACE_S", "3600")  # the run's end keeps its per-commit history
    reference = tmp_path / "sync.zarr"
    assert store_drill.run(str(reference)) == 0
    written = []
    writer = write_in_background(tmp_path / "bg.zarr", commit_interval=60.0,
                                 on_written=lambda *key: written.append(key))
    assert writer.commits == 1 and len(written) == 4
    assert len(store_commits(tmp_path / "bg.zarr")) == 1 < len(store_commits(reference))
    assert_same_store(tmp_path / "bg.zarr", reference, (store_drill.MODEL,))


def test_a_caller_waiting_for_room_cuts_the_gathering_short(tmp_path):
    """With a queue that holds one result, a caller waiting for room makes the thread commit what
    it gathered at once, not when the (long) interval ends: no stall, the same store."""
    reference = tmp_path / "sync.zarr"
    assert store_drill.run(str(reference)) == 0
    one = max(captured_bytes(v) for _, _, v, _, _ in drill_results())
    start = time.monotonic()
    writer = write_in_background(tmp_path / "bg.zarr", max_bytes=one + 1, commit_interval=60.0)
    assert time.monotonic() - start < 30 and writer.commits >= 3
    assert_same_store(tmp_path / "bg.zarr", reference, (store_drill.MODEL,))


def test_a_refused_result_in_a_gathered_commit_keeps_the_results_before_it(tmp_path):
    """One gathered commit is all or none; when the store refuses one of its results, the writer
    commits the forwards before it one by one and raises the refusal."""
    good = {"position": Variable(("token",), np.arange(3)), "hidden": Variable(("token", "dim"), np.zeros((3, 2)))}
    bad = {"position": Variable(("token",), np.arange(3)), "hidden": Variable(("token", "dim"), np.zeros((4, 2)))}
    with StoreWriter(tmp_path / "bg.zarr") as store:
        store.ensure_model("m", {"family": "x"})
        with pytest.raises(StoreError, match="disagree on the number of tokens"):
            with BackgroundWriter(store, commit_interval=60.0) as writer:
                for i, variables in enumerate([good, good, bad, good]):
                    writer.put("m", "c", f"s{i}", variables)
    assert [str(s) for s in open_store(tmp_path / "bg.zarr", model="m").run_sample.values] == ["s0", "s1"]


def test_closing_writes_everything_queued_without_waiting_out_intervals(tmp_path):
    """At close (the end of a run, or Ctrl-C) the queue is written at once, in commits of at most
    the gathering caps (here one result, behind or not), never waiting out the (long) interval
    between them."""
    with StoreWriter(tmp_path / "bg.zarr") as store:
        store.ensure_model(store_drill.MODEL, {"family": "drill"})
        gate = threading.Event()
        writer = BackgroundWriter(store, commit_interval=60.0, on_written=lambda *key: gate.wait(5))
        writer._gather_bytes = writer._backlog_bytes = 1  # every result its own commit
        start = time.monotonic()
        with writer:
            for name, sample, variables, attrs, input_hash in drill_results():
                writer.put(store_drill.MODEL, name, sample, variables, attrs, input_hash)
            gate.set()
    assert time.monotonic() - start < 30 and writer.commits == 4
    assert len(open_store(tmp_path / "bg.zarr", model=store_drill.MODEL).run_sample) == 4


def test_a_commit_gathers_its_full_share_while_the_one_before_it_is_written(tmp_path):
    """The gathering cap counts the results waiting for a commit, not the ones being written:
    with results arriving faster than a commit's worth is written, every commit but the last
    (at close) holds a full cap of results. Counting the results in flight too had cut every
    commit after the first at about half its size (twice the commits' fixed cost)."""
    hidden = {"token_id": Variable(("token",), np.arange(3)), "hidden": Variable(("token", "dim"), np.zeros((3, 2)))}
    sizes = []
    with StoreWriter(tmp_path / "s.zarr") as store:
        store.ensure_model("m", {"family": "x"})
        write = store.write_samples

        def slow_write(results):
            sizes.append(len(results))
            time.sleep(0.05)  # a commit's worth of results arrives in 0.1 s: half of it meanwhile
            return write(results)

        store.write_samples = slow_write
        with BackgroundWriter(store, commit_interval=60.0) as writer:
            writer._gather_bytes = 10 * captured_bytes(hidden)
            for i in range(45):
                writer.put("m", "c", f"s{i}", hidden)
                time.sleep(0.01)
    assert sum(sizes) == 45 and sizes[:-1] == [10] * (len(sizes) - 1), sizes
    assert len(open_store(tmp_path / "s.zarr", model="m").run_sample) == 45


def test_a_commit_never_goes_over_the_gathering_cap_by_one_more_result(tmp_path):
    """A result that would take a gathered commit over its cap waits for the next commit (a
    result over the cap alone is committed alone): large results are committed as they come,
    so what a run holds stays within the cap. Results of 1 and 4 units under a cap of 5: a
    commit taking whatever comes next until it reaches the cap would hold 1 + 1 + 4."""
    def result(rows: int) -> dict[str, Variable]:
        return {"token_id": Variable(("token",), np.arange(rows)), "hidden": Variable(("token", "dim"), np.zeros((rows, 2)))}

    one = captured_bytes(result(3))
    units = [1, 1, 4, 1, 4, 4, 1, 1, 1, 1, 4, 6, 1, 4, 1, 1]
    commits = []
    with StoreWriter(tmp_path / "s.zarr") as store:
        store.ensure_model("m", {"family": "x"})
        write = store.write_samples

        def recorded(results):
            commits.append(sum(captured_bytes(r[3]) for r in results) / one)
            time.sleep(0.05)  # results queue up behind it
            return write(results)

        store.write_samples = recorded
        with BackgroundWriter(store, commit_interval=60.0) as writer:
            writer._gather_bytes = writer._backlog_bytes = 5 * one  # a backlog takes no more either
            for i, n in enumerate(units):
                writer.put("m", "c", f"s{i}", result(3 * n))
    assert sum(commits) == sum(units) and len(commits) > 1, commits
    assert all(c <= 5 or c in (4, 6) for c in commits) and max(commits) <= 6, commits
    assert 6 in commits  # the result over the cap, alone
    ds = open_store(tmp_path / "s.zarr", model="m")
    assert [str(s) for s in ds.run_sample.values] == [f"s{i}" for i in range(len(units))]


def test_a_writer_behind_commits_its_whole_backlog_within_the_queue_cap(tmp_path):
    """Where results arrive faster than commits are written (a fast forward: a GPU), a commit
    takes everything already waiting, up to a quarter of the queue's cap, instead of a gathering
    cap's worth: the commits' fixed cost is paid fewer times. The joined copy of a commit counts
    against the queue's cap while it is written, so queue and copy together stay within it."""
    hidden = {"token_id": Variable(("token",), np.arange(3)), "hidden": Variable(("token", "dim"), np.zeros((3, 2)))}
    one = captured_bytes(hidden)
    sizes, held = [], []
    with StoreWriter(tmp_path / "s.zarr") as store:
        store.ensure_model("m", {"family": "x"})
        write = store.write_samples
        with BackgroundWriter(store, max_bytes=80 * one, commit_interval=60.0) as writer:
            def slow_write(results):
                sizes.append(len(results))
                held.append(writer.queued_bytes)
                # the commit's results and their joined copy are both counted while it is written
                assert writer.queued_bytes >= (2 if len(results) > 1 else 1) * len(results) * one
                time.sleep(0.2)  # 40 results arrive within the first commits
                return write(results)

            store.write_samples = slow_write
            # caps of 2 and 20 results (by default 32 MiB and a quarter of the queue's cap)
            writer._gather_bytes, writer._backlog_bytes = 2 * one, 20 * one
            for i in range(40):
                writer.put("m", "c", f"s{i}", {**hidden, "hidden": Variable(("token", "dim"), np.full((3, 2), float(i)))})
                time.sleep(0.005)
    assert sum(sizes) == 40 and sizes[0] <= 3 and max(sizes) > 3 and max(sizes) <= 21, sizes
    assert len(sizes) <= 6, sizes  # with commits of the gathering cap alone: 20
    assert max(held) <= 80 * one and writer.peak_bytes <= 80 * one
    ds = open_store(tmp_path / "s.zarr", model="m")
    assert [str(s) for s in ds.run_sample.values] == [f"s{i}" for i in range(40)]
    np.testing.assert_array_equal(ds.hidden.values[:, 0], np.repeat(np.arange(40.0), 3))


@pytest.mark.parametrize("second", ["shape", "coordinate"])
def test_results_of_one_commit_must_agree_with_each_other(tmp_path, second):
    """Gathered results of one new condition are appended as one block: a later result whose
    per-row shape or coordinate differs from an earlier one in the same commit is refused (not
    stored under the first one's coordinate), and the store keeps nothing of that commit."""
    def result(layers, width=2):
        return {"position": Variable(("token",), np.arange(3)),
                "hidden": Variable(("token", "layer", "dim"), np.zeros((3, len(layers), width)), {"layer": np.array(layers)})}

    other = result([0, 1], width=3) if second == "shape" else result([0, 2])
    with StoreWriter(tmp_path / "s.zarr") as store:
        store.ensure_model("m", {"family": "x"})
        store.write_samples([("m", "other", "s0", result([0, 1]), None, "")])
        with pytest.raises(StoreError, match="shape .* does not match|coordinate layer differs"):
            store.write_samples([("m", "c", "s0", result([0, 1]), None, ""), ("m", "c", "s1", other, None, "")])
    assert "c" not in set(open_store(tmp_path / "s.zarr", model="m").condition.values)


def test_commits_are_paced_to_a_small_share_of_the_time(tmp_path):
    """With a 1 ms interval the writer would commit every result that arrives while it commits;
    after a commit of d seconds it gathers for 49 d instead (commits take ~2 % of the time), so
    results arriving every 20 ms for 0.4 s land in a few commits, all stored."""
    with StoreWriter(tmp_path / "s.zarr") as store:
        store.ensure_model("m", {"family": "x"})
        with BackgroundWriter(store, commit_interval=0.001) as writer:
            for i in range(20):
                writer.put("m", "c", f"s{i}", {"token_id": Variable(("token",), np.arange(3)),
                                               "hidden": Variable(("token", "dim"), np.full((3, 2), float(i)))})
                time.sleep(0.02)
    paced = writer.pace()  # the thread has stopped: its last commit is the one it paces by
    assert writer.commits <= 4, writer.commits
    # the last commit's time, stretched: commits take COMMIT_SHARE of the time
    assert paced == pytest.approx(min(10.0, max(0.001, writer._last_commit_s * (1 / COMMIT_SHARE - 1))))
    assert paced >= 0.001 * 49  # stretched far past the 1 ms interval
    ds = open_store(tmp_path / "s.zarr", model="m")
    assert len(ds.run_sample) == 20 and np.array_equal(ds.hidden.values[::3, 0], np.arange(20.0))


def test_the_store_derives_sample_and_position_and_packs_the_run_texts(tmp_path):
    """Format 3: no per-token `sample` or `position` array is stored (nor per patch); the reader
    derives them from the run rows, equal to what the writer was handed. The per-run text labels
    are one JSON array; a label one result lacks reads as "". `modality` is stored as int8 codes."""
    import zarr

    from workbench.store import _root_of

    def result(n, texts, patches=0):
        out = {"position": Variable(("token",), np.arange(n)), "token_id": Variable(("token",), np.arange(n) + 100),
               "modality": Variable(("token",), np.array((["vision", "boundary"] + ["text"] * n)[:n])),
               "hidden": Variable(("token", "dim"), np.ones((n, 2))),
               **{k: Variable(("run",), np.array([v], dtype=object)) for k, v in texts.items()}}
        if patches:
            out["vision_hidden"] = Variable(("vision_patch", "dim"), np.zeros((patches, 2)))
            out["patch_position"] = Variable(("vision_patch",), np.arange(patches))
        return out

    with StoreWriter(tmp_path / "s.zarr") as store:
        store.ensure_model("m", {"family": "x"})
        store.write_samples([("m", "c", "a", result(3, {"run_question": "why?", "run_prompt": "é <x>"}, 4), None, ""),
                             ("m", "c", "b", result(2, {"run_question": "how?"}, 5), None, "")])
        store.write_sample("m", "c", "z", result(4, {"run_question": "", "run_answer": "7"}, 1))
        with pytest.raises(StoreError, match="position: expected 0, 1, 2"):
            store.write_sample("m", "c", "bad", {**result(3, {}), "position": Variable(("token",), np.array([0, 2, 1]))})
        with pytest.raises(StoreError, match="modality: 'audio' .* expected one of vision, boundary, text"):
            store.write_sample("m", "c", "bad", {**result(3, {}), "modality": Variable(("token",), np.array(["audio"] * 3))})
        repo = store.repo
    group = _root_of(repo, repo.readonly_session(branch="main"))["m/c"]
    assert isinstance(group, zarr.Group)
    assert {"sample", "position", "patch_sample", "patch_position", "run_question"}.isdisjoint(set(group.array_keys()))
    assert "run_text" in set(group.array_keys()) and group["modality"].dtype == np.int8
    ds = open_store(tmp_path / "s.zarr", model="m", index=False)
    assert list(ds.sample.values) == ["a"] * 3 + ["b"] * 2 + ["z"] * 4
    assert list(ds.position.values) == [0, 1, 2, 0, 1, 0, 1, 2, 3]
    assert list(ds.modality.values) == ["vision", "boundary", "text", "vision", "boundary", "vision", "boundary", "text", "text"]
    assert list(ds.patch_sample.values) == ["a"] * 4 + ["b"] * 5 + ["z"]
    assert list(ds.patch_position.values) == [0, 1, 2, 3, 0, 1, 2, 3, 4, 0]
    assert list(ds.run_question.values) == ["why?", "how?", ""] and list(ds.run_prompt.values) == ["é <x>", "", ""]
    assert list(ds.run_answer.values) == ["", "", "7"] and "run_text" not in ds.variables
    assert "run_generated_text" not in ds.variables  # no result had it
    indexed = open_store(tmp_path / "s.zarr", model="m")
    assert indexed.sel(sample="b").token_id.values.tolist() == [100, 101]


def test_a_store_of_another_format_is_refused_for_writing_and_left_as_it_was(tmp_path):
    """A store written by an earlier workbench (format 2: per-token sample/position arrays) is
    not appended to in format 3: the writer refuses it up front, naming both formats."""
    import zarr

    from workbench.errors import StorePathError
    from workbench.store import STORE_FORMAT, _open_repo, store_history

    path = tmp_path / "old.zarr"
    with StoreWriter(path) as store:
        store.write_sample("m", "c", "s0", {"token_id": Variable(("token",), np.arange(3))})
    repo = _open_repo(path)
    session = repo.writable_session("main")
    zarr.open_group(session.store, mode="a", zarr_format=3).attrs["workbench_format"] = STORE_FORMAT - 1
    session.commit("as an earlier workbench wrote it")
    before = store_history(path)
    with pytest.raises(StorePathError, match=f"has store format {STORE_FORMAT - 1}; this workbench writes format {STORE_FORMAT}"):
        StoreWriter(path)
    assert store_history(path) == before


@pytest.mark.parametrize("cache", ["on", "off", "labels only"])
def test_appends_across_chunk_boundaries_read_back_exactly_without_reading_chunks(tmp_path, monkeypatch, cache):
    """The writer keeps each array's partial last chunk row (as committed) and writes an append
    from that chunk's start, so zarr never reads a chunk back: random sample lengths over small
    chunks, commits of several results, a refused commit, and a reopened writer (which reads
    each partial chunk back once) still read back equal to the inputs. With the cache off
    (`_TAIL_CACHE_BYTES = 0`) zarr reads the chunks, which shows that the count is real; with a
    per-array limit below the capture's chunk row (its bytes), zarr merges into the capture's chunks itself."""
    import zarr.storage

    import workbench.store as store_module

    monkeypatch.setattr(store_module.layout, "_CHUNK_BYTES", 2048)  # 64 rows of 8 float32s
    monkeypatch.setitem(store_module._LABEL_CHUNK, "token", 48)
    monkeypatch.setitem(store_module._LABEL_CHUNK, "run", 4)
    if cache == "off":
        monkeypatch.setattr(store_module.writer, "_TAIL_CACHE_BYTES", 0)
    elif cache == "labels only":  # a hidden chunk row is 64 x 64 bytes, a label one at most 48 x 8
        monkeypatch.setattr(store_module.appending, "_TAIL_ARRAY_BYTES", 400)
    reads: list[str] = []
    get = zarr.storage.StorePath.get

    async def counting_get(self, *args, **kwargs):
        if "/c/" in self.path:  # a chunk key (zarr v3: <array>/c/<i>/<j>...)
            reads.append(self.path)
        return await get(self, *args, **kwargs)

    monkeypatch.setattr(zarr.storage.StorePath, "get", counting_get)
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 90, size=14)
    texts = ["é", "a b", "<img>", "x" * 30]

    def result(i, n):
        return {"token_id": Variable(("token",), rng.integers(0, 1000, n)),
                "token_text": Variable(("token",), np.array([texts[(i + k) % 4] for k in range(n)], dtype=object)),
                "hidden": Variable(("token", "layer", "dim"), rng.standard_normal((n, 2, 8)).astype(np.float32))}

    inputs = [(f"s{i}", result(i, int(n))) for i, n in enumerate(lengths)]
    path = tmp_path / "s.zarr"
    groups = [[0], [1, 2, 3], [4], [5, 6], [7]], [[8, 9], [10], [11, 12, 13]]
    for part, commits in enumerate(groups):  # a second writer reopens the store
        with StoreWriter(path) as store:
            store.ensure_model("m", {"family": "x"})
            for k, commit in enumerate(commits):
                if k == 1:
                    reads.clear()  # from here on each array's tail is this writer's own
                    # refused after "c" was staged: nothing of it is committed, and no tail moves
                    bad = {**result(0, 3), "hidden": Variable(("token", "layer", "dim"), np.zeros((3, 2, 9)))}
                    with pytest.raises(StoreError, match="does not match"):
                        store.write_samples([("m", "c", f"new{part}", inputs[commit[0]][1], None, ""),
                                             ("m", "c2", "t0", result(0, 3), None, ""), ("m", "c2", "t1", bad, None, "")])
                store.write_samples([("m", "c", *inputs[i], None, "") for i in commit])
            if cache == "on":
                assert reads == []
            else:
                assert reads
                assert cache == "off" or {r.split("/")[2] for r in reads} == {"hidden"}
    ds = open_store(path, model="m", index=False)
    assert ds.sample.values.tolist() == [s for s, v in inputs for _ in range(len(v["token_id"].data))]
    for name in ("token_id", "token_text", "hidden"):
        expected = np.concatenate([v[name].data for _, v in inputs])
        assert (ds[name].values == expected).all(), name


def test_appended_arrays_read_back_as_written_with_zarrs_own_metadata(tmp_path, monkeypatch):
    """The writer appends a partial last chunk from its start with the tail it keeps in memory
    (`store.appending`). After commits of random lengths over small chunks (edge chunks padded,
    chunks rewritten from their start, a condition created in a later commit, variables new to
    a condition after a reopen, tails read back), every array reads back equal to its inputs,
    and its zarr.json equals what zarr's own create_array writes for the same rows (the
    independent path: a plain zarr array in a memory store)."""
    import zarr
    import zarr.storage

    import workbench.store as store_module

    monkeypatch.setattr(store_module.layout, "_CHUNK_BYTES", 2048)  # 32 rows of 2 x 8 float32s
    monkeypatch.setitem(store_module._LABEL_CHUNK, "token", 40)
    monkeypatch.setitem(store_module._LABEL_CHUNK, "run", 3)
    rng = np.random.default_rng(11)
    texts = ["é", "a b", "", "<row_1_col_2>", "x" * 50]

    def result(n):
        return {"token_id": Variable(("token",), rng.integers(0, 50_000, n)),
                "modality": Variable(("token",), np.array(["text"] * n)),
                "token_text": Variable(("token",), np.array([texts[k] for k in rng.integers(0, 5, n)], dtype=object)),
                "hidden": Variable(("token", "layer", "dim"), rng.standard_normal((n, 2, 8)).astype(np.float32),
                                   coords={"layer": np.array([0, 3])}),
                "logprobs": Variable(("run", "step", "vocab"), rng.standard_normal((1, 2, 5)).astype(np.float32))}

    inputs = {c: [(f"s{i}", result(int(n))) for i, n in enumerate(rng.integers(1, 70, size=9))] for c in ("a", "b")}
    path = tmp_path / "s.zarr"
    with StoreWriter(path) as store:
        store.ensure_model("m", {"family": "x"})
        for commit in ([0], [1, 2, 3], [4], [5, 6, 7, 8]):
            # condition b starts a commit later: its arrays are created while a's are appended to
            conditions = ("a",) if commit == [0] else ("a", "b")
            store.write_samples([("m", c, *inputs[c][i], None, "") for c in conditions for i in commit])
        store.write_samples([("m", "b", *inputs["b"][0], None, "")])
    # a reopened writer, and variables new to a condition that holds rows: earlier rows read as
    # fill values (as zarr reads chunks never written), not as the new rows
    late = {**result(30), "generated": Variable(("run", "step"), np.array([[7, 8]])),
            "keys": Variable(("token", "kv"), rng.standard_normal((30, 4)).astype(np.float32))}
    with StoreWriter(path) as store:
        store.write_samples([("m", "a", "late", late, None, "")])
    inputs["a"].append(("late", late))

    _, session = store_module._read_session(path)
    stored = zarr.open_group(session.store, mode="r")
    for condition, results in inputs.items():
        order = results if condition == "a" else results[1:] + results[:1]
        group = stored[f"m/{condition}"]
        for name in ("token_id", "token_text", "hidden", "logprobs"):
            expected = np.concatenate([v[name].data for _, v in order])
            assert (group[name][:] == expected).all(), (condition, name)
        tokens = sum(len(v["token_id"].data) for _, v in order[:-1])
        if condition == "a":
            assert group["generated"][:].tolist() == [[0, 0]] * 9 + [[7, 8]]
            assert (group["keys"][:tokens] == 0).all() and (group["keys"][tokens:] == late["keys"].data).all()
        for name, array in group.arrays():
            if name in ("layer",):  # coordinates are written by zarr itself
                continue
            data = array[:]
            dims = tuple(array.metadata.dimension_names)
            reference_store = zarr.storage.MemoryStore()
            layout = store_module._array_layout(name, Variable(dims, data))
            with zarr.config.set({"array.write_empty_chunks": True}):  # read when the array is made
                reference = zarr.create_array(reference_store, **{**layout, "shape": data.shape})
                reference[:] = data
            assert array.metadata.to_dict() == reference.metadata.to_dict(), f"{condition}/{name}"

