"""eagle3_capture/dump_format: the dump record's one validator and reader (the plugin writes such records; the doctor,
the tests and the GPU report read them through it; the plugin's own records are checked against it in
tests/plugin/test_sglang_served_dump.py and tests/engine). Engine-free: no SGLang here."""
import copy

import pytest
import torch
from hypothesis import given, settings, strategies as st

from eagle3_capture import dump_format as df


def good(T=5, K=3, H=8, L=6, stream=True):
    g = torch.Generator().manual_seed(0)
    rec = {
        "format": df.FORMAT, "seq": 0, "forward_mode": "EXTEND", "graph": False,
        "input_ids": torch.arange(T, dtype=torch.int64), "positions": torch.arange(T, dtype=torch.int64),
        "requests": [{"rid": "a", "row_start": 0, "row_end": 2, "prefix_len": 0},
                     {"rid": "eagle3-doctor-x-0", "row_start": 2, "row_end": T, "prefix_len": 3}],
        "aux": torch.randn(T, K * H, generator=g), "layers_to_capture": [0, 2, L],
        "draft_ids": [-1, 1, L - 1], "declared": ["Embedding", "LayerOutput(1)", f"LayerOutput({L - 1})"],
        "declared_convention": "draft_ids", "describe": "taps [...]",
        "stream": torch.randn(L + 1, T, H, generator=g) if stream else None,
        "stream_layer_inputs": list(range(L + 1)) if stream else None,
        "num_layers": L, "hidden_size": H, "model_class": "DeepseekV3ForCausalLM", "dtype": "torch.float32",
        "tp_rank": 0, "tp_size": 8, "attn_tp_rank": 0, "attn_tp_size": 8, "dp_rank": None,
        "writer": "attn-TP rank 0 ...: writes", "server": "0123456789abcdef", "host": "node-7.example", "pid": 6,
    }
    return rec


def as_v2(rec):
    """The same record as the plugin wrote it before version 3 (no writing process)."""
    return {**{k: v for k, v in rec.items() if k not in df.SERVER_FIELDS}, "format": df.FORMAT_V2}


def test_a_good_record_passes_and_round_trips_through_torch_save(tmp_path):
    for rec in (good(), good(stream=False)):
        assert df.record_problems(rec) == []
        p = tmp_path / df.file_name(rec["host"], rec["server"], 0, 7)
        torch.save(rec, p)
        back = torch.load(p, weights_only=True)  # the reader's way: no pickled code
        df.validate_record(back)
        assert df.record_problems(as_v2(rec)) == []  # version 2 is still read
    assert p.name == "eagle3_capture_node-7.example_0123456789abcdef_tp0_000007.pt" and df.FILE_RE.match(p.name)
    assert df.file_name("pod_a/b c", "0123456789abcdef", 1, 2) == \
        "eagle3_capture_pod-a-b-c_0123456789abcdef_tp1_000002.pt"
    assert df.FILE_RE.match(df.file_name("ü" * 200, "0123456789abcdef", 0, 0))
    assert df.FILE_RE.match(df.file_name("", "0123456789abcdef", 0, 0))
    with pytest.raises(ValueError, match="16 lower-case hex"):
        df.file_name("h", "pid6", 0, 0)
    assert not df.FILE_RE.match(p.name + ".tmp")
    assert df.V2_FILE_RE.match("eagle3_capture_pid123_tp0_000007.pt")
    assert df.V1_FILE_RE.match("eagle3_capture_pid123_0000.pt")
    assert df.is_doctor_rid("eagle3-doctor-run-1") and not df.is_doctor_rid("eagle3-doctorX") and \
        not df.is_doctor_rid(None)


BREAKS = [
    ("format", lambda r: r.update(format="eagle3-capture-dump/1"), "format"),
    ("missing", lambda r: r.pop("writer"), "missing keys ['writer']"),
    ("seq", lambda r: r.update(seq=True), "seq"),
    ("graph", lambda r: r.update(graph=1), "graph"),
    ("ids dtype", lambda r: r.update(input_ids=r["input_ids"].int()), "input_ids"),
    ("positions rows", lambda r: r.update(positions=torch.arange(4)), "positions has 4 rows"),
    ("negative position", lambda r: r["positions"].__setitem__(0, -1), "negative"),
    ("gap", lambda r: r["requests"][1].update(row_start=3), "do not follow"),
    ("short cover", lambda r: r["requests"][1].update(row_end=4), "cover rows [0, 4) of the 5"),
    ("request keys", lambda r: r["requests"][0].pop("prefix_len"), "requests[0] must be a dict"),
    ("rid type", lambda r: r["requests"][0].update(rid=3), "rid must be a string"),
    ("aux rows", lambda r: r.update(aux=r["aux"][:4]), "aux has 4 rows"),
    ("aux width", lambda r: r.update(aux=r["aux"][:, :16]), "aux is 16 wide"),
    ("aux ints", lambda r: r.update(aux=r["aux"].long()), "aux must be a floating"),
    ("dtype", lambda r: r.update(dtype="torch.bfloat16"), "dtype says"),
    ("ltc range", lambda r: r.update(layers_to_capture=[0, 2, 7]), "outside 0..6"),
    ("declared", lambda r: r.update(declared=["Embedding", "LayerOutput(-1)", "x"]), "declared must be"),
    ("convention", lambda r: r.update(declared_convention="hf"), "declared_convention"),
    ("stream alone", lambda r: r.update(stream_layer_inputs=None), "come together"),
    ("stream entries", lambda r: r.update(stream_layer_inputs=[0, 1, 2]), "stream has 7 entries"),
    ("stream order", lambda r: r.update(stream_layer_inputs=[6, 5, 4, 3, 2, 1, 0]), "sorted"),
    ("stream dtype", lambda r: r.update(stream=r["stream"].half()), "stream is torch.float16"),
    ("rank", lambda r: r.update(tp_rank=8), "tp_rank=8 is not below tp_size=8"),
    ("size", lambda r: r.update(attn_tp_size=0), "attn_tp_size must be an integer >= 1"),
    ("L", lambda r: r.update(num_layers=0), "num_layers must be an integer >= 1"),
    ("server", lambda r: r.update(server="pid6"), "server must be the writing process's id"),
    ("server missing", lambda r: r.pop("server"), "missing keys ['server']"),
    ("host", lambda r: r.update(host=""), "host must be a non-empty string"),
    ("pid", lambda r: r.update(pid=0), "pid must be an integer >= 1"),
    # issue 42: the declaration must agree with the rest of the record
    ("2 of 3 taps", lambda r: r.update(declared=["Embedding", "LayerOutput(1)"], draft_ids=[-1, 1]),
     "declared names 2 taps ['Embedding', 'LayerOutput(1)'], layers_to_capture 3 slots"),
    ("4 taps for 3 slots", lambda r: r.update(declared=["Embedding", "LayerOutput(1)", "LayerOutput(2)",
                                                        "LayerOutput(5)"], draft_ids=[-1, 1, 2, 5]),
     "declared names 4 taps"),
    ("beyond the model", lambda r: r.update(declared=["Embedding", "LayerOutput(1)", "LayerOutput(99)"],
                                            draft_ids=[-1, 1, 99]), "LayerOutput(99) is beyond the model's 6 layers"),
    ("draft ids", lambda r: r.update(draft_ids=[-1, 2, 5]), "draft_ids [-1, 2, 5] are not the declared taps"),
    ("draft ids count", lambda r: r.update(draft_ids=[-1, 1]), "draft_ids 2 ids"),
    ("unsorted taps", lambda r: r.update(declared=["LayerOutput(1)", "Embedding", "LayerOutput(5)"]),
     "not distinct and in order"),
    ("empty declaration", lambda r: r.update(declared=[]), "declared is an empty list"),
]


@pytest.mark.parametrize("name,breaks,says", BREAKS, ids=[b[0] for b in BREAKS])
def test_each_departure_is_named(name, breaks, says):
    rec = good()
    breaks(rec)
    problems = df.record_problems(rec)
    assert any(says in p for p in problems), problems
    with pytest.raises(df.DumpRecordError, match="not an eagle3-capture-dump/3 record"):
        df.validate_record(rec, "x.pt")


def test_a_version_2_record_is_checked_as_version_2():
    """Version 2 has no writing process: its server fields are not asked for, and a version-2 record that breaks
    the contract is named as one."""
    rec = as_v2(good())
    assert df.record_problems(rec) == []
    rec["aux"] = rec["aux"][:4]
    with pytest.raises(df.DumpRecordError, match="not an eagle3-capture-dump/2 record: aux has 4 rows"):
        df.validate_record(rec, "x.pt")
    assert any("missing keys ['server', 'host', 'pid']" in p
               for p in df.record_problems({**as_v2(good()), "format": df.FORMAT}))


VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 10), st.text(max_size=8),
                   st.lists(st.integers(-2, 8), max_size=4),
                   st.builds(lambda n: torch.zeros(n, dtype=torch.int64), st.integers(0, 6)),
                   st.builds(lambda n: torch.zeros(n, 3), st.integers(0, 6)))


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(df.FIELDS), value=VALUES)
def test_fuzz_any_field_any_value_never_crashes_the_validator(key, value):
    rec = copy.deepcopy(good())
    rec[key] = value
    problems = df.record_problems(rec)  # a list, whatever the value: never an exception
    assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)
    if problems:
        with pytest.raises(df.DumpRecordError):
            df.validate_record(rec)


def test_not_a_dict():
    assert df.record_problems([1, 2]) == ["a record is a dict, got list"]


def small_v2():
    """A complete version-2 record, L=3, H=2, K=3, with a stream at layer inputs 0 and 1."""
    return {**good(T=4, K=3, H=2, L=3), "requests": [{"rid": "r", "row_start": 0, "row_end": 4, "prefix_len": 0}],
            "aux": torch.zeros(4, 6), "layers_to_capture": [0, 1, 2], "stream": torch.zeros(2, 4, 2),
            "stream_layer_inputs": [0, 1], "draft_ids": None, "declared": None, "declared_convention": None}


READER_BREAKS = [({"positions": torch.arange(3)}, "positions"), ({"aux": torch.zeros(3, 6)}, "aux"),
                 ({"aux": torch.zeros(4, 5)}, "layers_to_capture"), ({"stream": torch.zeros(3, 4, 2)}, "stream"),
                 ({"stream_layer_inputs": [0, 9]}, "stream_layer_inputs"),
                 ({"requests": [{"rid": "r", "row_start": 0, "row_end": 5, "prefix_len": 0}]}, "requests"),
                 ({"requests": [{"rid": 3, "row_start": 0, "row_end": 4, "prefix_len": 0}]}, "rid"),
                 ({"input_ids": torch.zeros(4)}, "input_ids"), ({"hidden_size": 0}, "hidden_size"),
                 ({"format": "eagle3-capture-dump/4"}, "format 'eagle3-capture-dump/4'; this reader reads"),
                 ({"format": ["eagle3-capture-dump/3"]}, "format ['eagle3-capture-dump/3']; this reader reads"),
                 ({"server": "ABC"}, "server must be")]


@pytest.mark.parametrize("change,needle", READER_BREAKS, ids=[n for _, n in READER_BREAKS])
def test_the_reader_checks_each_record_with_the_contract(change, needle):
    """The reader's record (what the doctor reads) passes only what the contract passes, naming the field."""
    rec = df.read_record(small_v2(), "x")
    assert (rec.version, rec.rows, rec.layers_to_capture, rec.stream_layer_inputs, rec.graph) == (3, 4, [0, 1, 2],
                                                                                                   [0, 1], False)
    assert (rec.server, rec.host, rec.pid) == ("0123456789abcdef", "node-7.example", 6)
    old = df.read_record(as_v2(small_v2()), "x")
    assert (old.version, old.server, old.host, old.pid, old.rows) == (2, None, None, None, 4)
    assert [(r.rid, r.row_start, r.row_end, r.prefix_len) for r in rec.requests] == [("r", 0, 4, 0)]
    with pytest.raises(df.DumpRecordError, match=r"^dump x: .*" + needle.replace("[", r"\[").replace("]", r"\]")):
        df.read_record({**small_v2(), **change}, "x")


V1 = {"aux": torch.zeros(4, 6), "input_ids": [5, 6, 7, 8], "positions": torch.arange(4, dtype=torch.int32),
      "forward_mode": "EXTEND", "layers_to_capture": torch.tensor([0, 1, 2]), "num_layers": torch.tensor(3),
      "hidden_size": 2, "draft_ids": (-1, 0, 1)}
V1_BREAKS = [({"positions": None}, "no 'positions'"), ({"input_ids": torch.zeros(4)}, "input_ids must be"),
             ({"input_ids": torch.zeros(2, 2, dtype=torch.int64)}, "input_ids must be"),
             ({"positions": [0, 1, 2]}, "positions has 3 entries"), ({"aux": torch.zeros(3, 6)}, "aux has 3 rows"),
             ({"aux": torch.zeros(4, 6, dtype=torch.int64)}, "aux must be a floating"),
             ({"num_layers": 0}, "num_layers must be"), ({"hidden_size": 4}, "aux is 6 wide"),
             ({"layers_to_capture": [0.5]}, "layers_to_capture must be"), ({"forward_mode": 3}, "forward_mode"),
             ({"declared": "Embedding"}, "declared must be")]


@pytest.mark.parametrize("change,needle", V1_BREAKS, ids=[n for _, n in V1_BREAKS])
def test_version_1_records_are_read_and_checked(change, needle):
    """The plugin's older records (no format key): ids as lists or integer tensors of any width, counts as tensors."""
    rec = df.read_record(dict(V1), "old.pt")
    assert (rec.version, rec.requests, rec.input_ids.dtype, rec.positions.tolist(), rec.num_layers,
            rec.layers_to_capture, rec.draft_ids) == (1, None, torch.int64, [0, 1, 2, 3], 3, [0, 1, 2], [-1, 0, 1])
    assert df.v1_record_problems(dict(V1)) == []
    with pytest.raises(df.DumpRecordError, match="dump old.pt: not a version-1 dump record: .*" + needle):
        df.read_record({**V1, **change}, "old.pt")


def test_reading_files(tmp_path):
    p = tmp_path / df.file_name("h", "0123456789abcdef", 0, 0)
    torch.save(small_v2(), p)
    (tmp_path / (df.file_name("h", "0123456789abcdef", 0, 1) + ".tmp")).write_bytes(b"in flight")
    reader = df.DumpReader(str(tmp_path))
    assert [r.path for r in reader.refresh()] == [str(p)]
    bad = tmp_path / df.file_name("h", "0123456789abcdef", 0, 2)
    bad.write_bytes(b"not a torch file")
    with pytest.raises(df.DumpError, match="not a readable dump record"):
        reader.refresh()
    with pytest.raises(df.DumpError, match="no such file or directory"):
        df.dump_files(str(tmp_path / "nowhere"))


def _record(path, **change):
    rec = {**small_v2(), **change}
    torch.save(rec, path)
    return path


def test_inventory_names_each_declaration_and_its_writers(tmp_path):
    """Issue 32, kind 1: replicas sharing a directory. Records of two servers with two capture declarations are two
    groups, each naming its writers and records; the caller's expected layer inputs tag the one that differs."""
    a, b = "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"
    for seq in range(3):
        _record(tmp_path / df.file_name("h", a, 0, seq), server=a, host="h", pid=6)
        _record(tmp_path / df.file_name("h", b, 0, seq), server=b, host="h", pid=6, layers_to_capture=[1, 2, 3],
                declared=["LayerOutput(0)", "LayerOutput(1)", "LayerOutput(2)"], draft_ids=[0, 1, 2])
    recs = df.DumpReader(str(tmp_path)).refresh()
    inv = df.inventory(recs, expected=[0, 1, 2], expected_source="the draft config")
    assert inv.several_declarations and inv.several_writers and inv.records == 6 and inv.note() is None
    line = inv.mixed()
    assert line.startswith("the records come from 2 capture declarations") and "\n" not in line
    assert ("(1) no declared taps, captured at layer inputs [0, 1, 2] -- the layer inputs the draft config declares: "
            f"3 record(s) (eagle3_capture_h_{a}_tp0_000000.pt, eagle3_capture_h_{a}_tp0_000001.pt, ...) by server "
            f"{a} (host h, pid 6)") in line
    assert ("(2) declared [LayerOutput(0), LayerOutput(1), LayerOutput(2)] (draft ids [0, 1, 2]), captured at layer "
            "inputs [1, 2, 3] -- NOT the layer inputs the draft config declares: 3 record(s)") in line
    assert f"by server {b} (host h, pid 6)" in line
    j = inv.to_json()
    assert [d["servers"] for d in j["declarations"]] == [[a], [b]] and [d["expected"] for d in j["declarations"]] \
        == [True, False]
    # one declaration, two writers (two replicas or DP groups): a note, no finding
    inv = df.inventory([r for r in recs if r.server == a] + [df.read_record({**small_v2(), "server": b}, "x")])
    assert inv.mixed() is None and inv.note().startswith("the records come from 2 writing processes with one capture "
                                                         "declaration")
    # one writer: nothing to say
    assert df.inventory(r for r in recs if r.server == a).note() is None


def test_inventory_of_version_2_records_says_their_pid_is_not_an_identity(tmp_path):
    v2 = as_v2(small_v2())
    torch.save(v2, tmp_path / "eagle3_capture_pid6_tp0_000000.pt")
    torch.save({**v2, "layers_to_capture": [0, 1, 3]}, tmp_path / "eagle3_capture_pid6_tp0_000001.pt")
    inv = df.inventory(df.DumpReader(str(tmp_path)).refresh())
    assert len(inv.writers) == 1 and inv.several_declarations
    assert "a version-2 writer with pid 6 in its file names (no server id: replicas in separate PID namespaces " \
           "share pids)" in inv.mixed()


def test_a_declaration_that_differs_from_the_capture_in_value_is_a_record_not_a_problem():
    """A server that captures other layer inputs than its draft declares is what the doctor finds: the record carries
    it. Only a declaration that contradicts the record's own shape is refused."""
    rec = good()
    rec["layers_to_capture"] = [1, 2, 5]   # one layer later than declared: miswired, and said
    assert df.record_problems(rec) == []


# ----------------------------------------------------------------------------------------------------------------
# issue 42: tensor bytes verified against the zip's CRC-32s
# ----------------------------------------------------------------------------------------------------------------

def _saved(tmp_path, name="r.pt"):
    rec = good()
    p = tmp_path / df.file_name(rec["host"], rec["server"], 0, 1)
    torch.save(rec, p)
    return p, rec


def test_changed_tensor_bytes_are_refused_naming_the_member(tmp_path):
    p, rec = _saved(tmp_path)
    df.load_record(str(p))  # the good one loads
    data = bytearray(p.read_bytes())
    i = data.find(rec["aux"][2].numpy().tobytes()[:16])
    assert i > 0
    data[i + 5] ^= 0x01   # one bit of one aux value
    p.write_bytes(bytes(data))
    with pytest.raises(df.DumpError) as ei:
        df.load_record(str(p))
    msg = str(ei.value)
    assert "fails its CRC-32" in msg and "/data/" in msg and "remove the record, or dump again" in msg, msg
    assert "\n" not in msg
    # before: torch.load took the changed bytes as data
    assert not torch.equal(torch.load(p, weights_only=True)["aux"], rec["aux"])


def test_a_record_without_crcs_is_unverifiable(tmp_path):
    import zipfile

    p, _ = _saved(tmp_path)
    q = tmp_path / "nocrc.pt"
    with zipfile.ZipFile(p) as src, zipfile.ZipFile(q, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
    raw = bytearray(q.read_bytes())
    with zipfile.ZipFile(q) as z:  # zero every CRC field (local headers and the directory), as an unchecked writer
        for info in z.infolist():
            crc = info.CRC.to_bytes(4, "little")
            raw = raw.replace(crc, b"\0\0\0\0")
    q.write_bytes(bytes(raw))
    with pytest.raises(df.DumpError, match="written without CRC-32s"):
        df.load_record(str(q))


@pytest.mark.parametrize("cut", [10, 100, 1000, -10])
def test_a_truncated_record_is_one_line(tmp_path, cut):
    p, _ = _saved(tmp_path)
    data = p.read_bytes()
    p.write_bytes(data[:cut])
    with pytest.raises(df.DumpError) as ei:
        df.load_record(str(p))
    assert "\n" not in str(ei.value) and str(p) in str(ei.value)


@settings(max_examples=60, deadline=None)
@given(where=st.integers(0, 10 ** 6), bit=st.integers(0, 7))
def test_fuzz_any_flipped_bit_is_refused_or_harmless(tmp_path_factory, where, bit):
    """Any single flipped bit: the record is refused (CRC, zip structure, contract) or it loads equal to what was
    written (a bit of the zip's own bookkeeping that reading does not use) -- never changed data."""
    d = tmp_path_factory.mktemp("flip")
    p, rec = _saved(d)
    data = bytearray(p.read_bytes())
    data[where % len(data)] ^= 1 << bit
    p.write_bytes(bytes(data))
    try:
        back = df.load_record(str(p))
    except df.DumpError:
        return
    assert torch.equal(back.aux, rec["aux"]) and torch.equal(back.stream, rec["stream"])
    assert torch.equal(back.input_ids, rec["input_ids"]) and back.declared == rec["declared"]


# ----------------------------------------------------------------------------------------------------------------
# issue 42: records keyed by writer as well as rid
# ----------------------------------------------------------------------------------------------------------------

def _record_of(rid, ltc, server, L=6, T=4, H=8, seq=0):
    g = torch.Generator().manual_seed(seq)
    rec = good(T=T, H=H, L=L, stream=False)
    rec.update(requests=[{"rid": rid, "row_start": 0, "row_end": T, "prefix_len": 0}], layers_to_capture=ltc,
               aux=torch.randn(T, len(ltc) * H, generator=g), server=server, seq=seq)
    return rec


def test_two_writers_of_one_rid_are_two_requests(tmp_path):
    """A miswired replica whose records reuse a correct replica's doctor rids: each writer's request is its own, so
    neither hides the other (before, the second's rows were dropped as 'the same row written twice')."""
    rid = "eagle3-doctor-run-0"
    good_rec, bad_rec = _record_of(rid, [0, 2, 6], "a" * 16), _record_of(rid, [1, 3, 6], "b" * 16, seq=1)
    paths = []
    for rec in (good_rec, bad_rec):
        p = tmp_path / df.file_name(rec["host"], rec["server"], 0, rec["seq"])
        torch.save(rec, p)
        paths.append(str(p))
    from eagle3_capture.dump_format.reader import by_rid, doctor_requests, one_writer

    reqs = doctor_requests(df.DumpReader(str(tmp_path)).refresh())
    assert sorted(reqs) == [("a" * 16, rid), ("b" * 16, rid)]
    assert [r.load().layers_to_capture for r in reqs.values()] == [[0, 2, 6], [1, 3, 6]]
    with pytest.raises(df.DumpError, match="is in the records of 2 writers"):
        one_writer(rid, by_rid(reqs)[rid], "--dump d")


def test_one_writer_key_two_captures_at_one_position_is_refused(tmp_path):
    """Version-2 records of two replicas in separate PID namespaces share a pid, so their writer is one key: rows of
    one rid captured differently at one position are refused, naming both files and what to do."""
    rid = "eagle3-doctor-run-0"
    for seq, ltc in ((0, [0, 2, 6]), (1, [1, 3, 6])):
        rec = as_v2(_record_of(rid, ltc, "a" * 16, seq=seq))
        torch.save(rec, tmp_path / f"eagle3_capture_pid6_tp0_{seq:06d}.pt")
    from eagle3_capture.dump_format.reader import doctor_requests

    [req] = doctor_requests(df.DumpReader(str(tmp_path)).refresh()).values()
    for read in (lambda: req.input_ids, lambda: req.load()):
        with pytest.raises(df.DumpError) as ei:
            read()
        msg = str(ei.value)
        assert "two records of one writer disagree at position 0" in msg and "layer inputs [0, 2, 6]" in msg, msg
        assert "eagle3_capture_pid6_tp0_000000.pt" in msg and "own EAGLE3_CAPTURE_DUMP directory" in msg


def test_two_records_of_one_token_that_disagree_say_so(tmp_path):
    """Two records giving one position two tokens: said as such (before, the doctor blamed "another prompts file,
    or another tokenizer")."""
    rid = "eagle3-doctor-run-0"
    a = _record_of(rid, [0, 2, 6], "a" * 16)
    b = _record_of(rid, [0, 2, 6], "a" * 16, seq=1)
    b["input_ids"] = b["input_ids"] + 7
    for rec in (a, b):
        torch.save(rec, tmp_path / df.file_name(rec["host"], rec["server"], 0, rec["seq"]))
    from eagle3_capture.dump_format.reader import doctor_requests

    [req] = doctor_requests(df.DumpReader(str(tmp_path)).refresh()).values()
    with pytest.raises(df.DumpError, match="disagree at position 0: token 0 in .* and token 7 in"):
        req.input_ids
