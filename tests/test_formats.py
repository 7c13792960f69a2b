"""Every input format gives the same documents; shards are plain Arrow IPC files read zero-copy."""
import gzip
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from helpers import contents, quick_build
from conftest import write_jsonl


@pytest.fixture(scope="module")
def docs(corpus):
    # one paragraph per document, so blank-line and line-per-document text files can hold them too
    return [" ".join(d.split()) for d in corpus["en"][:40] + corpus["zh"][:60]]


@pytest.fixture(scope="module")
def reference(docs, sp_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    src = write_jsonl(d / "docs.jsonl", [{"meta": {"text": t}} for t in docs])
    quick_build([src], d / "ds", tokenizer=sp_model, text_field="meta.text")
    return contents(d / "ds")


def _write(kind, docs, d):
    if kind == "jsonl.gz":
        with gzip.open(d / "docs.jsonl.gz", "wt", encoding="utf-8") as f:
            f.write(open(write_jsonl(d / "tmp.jsonl", [{"text": t} for t in docs]), encoding="utf-8").read())
        os.remove(d / "tmp.jsonl")
        return [d / "docs.jsonl.gz"], {}
    if kind == "jsonl-bom":  # a UTF-8 byte-order mark first, as Windows tools write
        raw = open(write_jsonl(d / "tmp.jsonl", [{"text": t} for t in docs]), "rb").read()
        (d / "docs.jsonl").write_bytes(b"\xef\xbb\xbf" + raw)
        os.remove(d / "tmp.jsonl")
        return [d / "docs.jsonl"], {}
    if kind == "jsonl.zst":  # two frames, as pzstd and `zstd -T` write
        raw = open(write_jsonl(d / "tmp.jsonl", [{"text": t} for t in docs]), "rb").read()
        half = raw.index(b"\n", len(raw) // 2) + 1
        (d / "docs.jsonl.zst").write_bytes(b"".join(zstandard.ZstdCompressor().compress(r) for r in (raw[:half],
                                                                                                     raw[half:])))
        os.remove(d / "tmp.jsonl")
        return [d / "docs.jsonl.zst"], {}
    table = pa.table({"id": list(range(len(docs))), "content": docs})
    if kind == "parquet":  # the text in a struct column's field, reached by the dotted name as in JSON
        nested = pa.table({"id": list(range(len(docs))), "meta": [{"text": t, "n": 1} for t in docs]})
        pq.write_table(nested, d / "docs.parquet", row_group_size=17)
        return [d / "docs.parquet"], {"text_field": "meta.text"}
    if kind == "parquet-named-otherwise":
        pq.write_table(table, d / "docs.bin", row_group_size=17)
        return [d / "docs.bin"], {"text_field": "content", "format": "parquet"}
    if kind == "arrow-file":
        with pa.ipc.new_file(str(d / "docs.arrow"), table.schema) as w:
            for b in table.to_batches(max_chunksize=13):
                w.write_batch(b)
        return [d / "docs.arrow"], {"text_field": "content"}
    if kind == "arrow-stream":  # what Hugging Face `datasets` save_to_disk writes, its metadata beside: no inputs
        with pa.ipc.new_stream(str(d / "data-00000-of-00001.arrow"), table.schema) as w:
            w.write_table(table)
        (d / "dataset_info.json").write_text(json.dumps({"features": {"content": {"dtype": "string"}}}, indent=2))
        (d / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]},
                                                 indent=2))
        return [d], {"text_field": "content"}
    if kind == "text-files":
        for i, t in enumerate(docs):
            (d / "sub").mkdir(exist_ok=True)
            (d / "sub" / f"doc{i:04d}.txt").write_text(t + "\n", encoding="utf-8")
        return [d], {"doc_boundary": "file"}
    if kind == "text-blank-line":
        (d / "a.txt").write_text("\n\n".join(docs[:50]) + "\n", encoding="utf-8")
        (d / "b.txt").write_text("\n\n\n".join(docs[50:]), encoding="utf-8")
        return [str(d / "*.txt")], {}
    if kind == "text-line":
        (d / "docs.txt").write_text("\n".join(docs) + "\n", encoding="utf-8")
        return [d / "docs.txt"], {"doc_boundary": "line"}
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["jsonl.gz", "jsonl-bom", "jsonl.zst", "parquet", "parquet-named-otherwise",
                                  "arrow-file", "arrow-stream", "text-files", "text-blank-line", "text-line"])
def test_every_format_gives_the_same_documents(kind, docs, reference, sp_model, tmp_path):
    (tmp_path / "in").mkdir()
    inputs, kw = _write(kind, docs, tmp_path / "in")
    manifest = quick_build(inputs, tmp_path / "ds", tokenizer=sp_model, **kw)
    assert contents(tmp_path / "ds") == reference
    assert manifest["num_documents"] == len(docs)


def test_shards_read_zero_copy_by_plain_pyarrow(small, sp_model, tmp_path):
    m = quick_build([small["path"]], tmp_path / "ds", tokenizer=sp_model, shard_size=64 << 10)
    assert len(m["shards"]) > 3
    total = 0
    allocated = pa.total_allocated_bytes()
    for s in m["shards"]:
        path = str(tmp_path / "ds" / s["file"])
        assert os.path.getsize(path) <= 64 << 10  # --shard-size is a maximum
        reader = pa.ipc.open_file(pa.memory_map(path))
        batch = reader.get_batch(0)
        ids = batch.column("input_ids")
        values = ids.values.to_numpy(zero_copy_only=True)  # raises if a copy were needed
        assert values.dtype == np.uint16 and not values.flags.owndata
        assert batch.num_rows == s["num_documents"] and len(values) == s["num_tokens"]
        total += len(values)
    assert total == m["num_tokens"]
    assert pa.total_allocated_bytes() == allocated  # nothing was copied into Arrow's memory pool
    # the same file through pyarrow's dataset API, as other tools read it
    import pyarrow.dataset as pads
    files = [str(tmp_path / "ds" / s["file"]) for s in m["shards"]]
    table = pads.dataset(files, format="arrow").to_table(columns=["input_ids"])
    assert table.num_rows == m["num_documents"]


def test_jsonl_blocks_split_into_the_lines_as_read(tmp_path):
    """JSONL travels to the workers as blocks of whole lines; split, they are the file's non-blank lines with their
    line numbers and sizes, whatever the block size, with blank and whitespace lines, \\r\\n, a last line without a
    newline, and records skipped on resume."""
    from data_prep.sources import Fields, read_chunks

    lines = [b'{"text": "a"}\n', b"\n", b'{"text": "bb"}\r\n', b" \t\n", b"\r\n", b'{"text": "' + b"c" * 50 + b'"}\n',
             b"\x0b\n", b'{"text": "d"}']
    path = tmp_path / "f.jsonl"
    path.write_bytes(b"".join(lines))
    want = [(k, line) for k, line in enumerate(lines, 1) if line.strip()]
    for size in (1, 7, 20, 1 << 20):
        for skip in (0, 1, 3, 4):
            chunks = [c.lines() for c in read_chunks([str(path)], 5, fmt=None, fields=Fields(), doc_boundary="blank",
                                                     skip=skip, size_bytes=size)]
            got = [(int(n), r, int(b), int(i)) for c in chunks
                   for n, r, b, i in zip(c.line, c.records, c.nbytes, c.file_index)]
            assert [(n, r.rstrip(b"\n")) for n, r, _, _ in got] == [(k, w.rstrip(b"\n")) for k, w in want[skip:]]
            assert [b for _, _, b, _ in got] == [len(w) for _, w in want[skip:]]
            assert {i for *_, i in got} <= {5} and all(len(c) == len(c.records) for c in chunks)


def test_directories_scanned_through_links_without_hidden_files_or_dataset_metadata(tmp_path):
    """A directory's scan follows links to folders (each real folder once: a link to an ancestor ends there),
    leaves hidden files and folders out, and of a Hugging Face `datasets` save_to_disk folder takes only the data
    files its state.json lists (of a DatasetDict, its splits'); a file named explicitly is read whatever it is."""
    from data_prep.sources import expand_inputs

    d, elsewhere = tmp_path / "in", tmp_path / "elsewhere"
    for folder in (d / "sub", d / ".hidden", d / "hf" / "train", elsewhere):
        folder.mkdir(parents=True)
    for path in (d / "sub" / "a.txt", elsewhere / "b.txt", d / ".hidden" / "c.txt", d / ".notes.txt"):
        path.write_text("text")
    os.symlink(elsewhere, d / "linked")
    os.symlink(d / "sub", d / "again")  # the same folder twice
    (d / "hf" / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    saved = {"state.json": json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}),
             "dataset_info.json": "{}", "data-00000-of-00001.arrow": "", "cache-0123.arrow": ""}
    for name, content in saved.items():
        (d / "hf" / "train" / name).write_text(content)
    assert [os.path.relpath(f, d) for f in expand_inputs([str(d)], None)] == [
        "hf/train/data-00000-of-00001.arrow", "linked/b.txt", "sub/a.txt"]
    named = [str(d / "hf" / "train" / "state.json"), str(d / ".notes.txt")]
    assert expand_inputs(named, None) == named
    (tmp_path / "loop" / "deeper").mkdir(parents=True)
    (tmp_path / "loop" / "a.txt").write_text("text")
    os.symlink(tmp_path / "loop", tmp_path / "loop" / "deeper" / "up")  # a cycle
    assert expand_inputs([str(tmp_path / "loop")], None) == [str(tmp_path / "loop" / "a.txt")]
