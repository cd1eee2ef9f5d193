"""bench/collectives.py reads a collective's replica groups in each of the three forms XLA prints, checked against a
plain re-implementation of what each form means (XLA's HloSharding/IotaReplicaGroupList docs)."""

import itertools

from levanter_mars.bench.collectives import collectives, crossing, only_over_dcn, parse_groups


def test_the_explicit_form():
    assert parse_groups("x = f32[2]{0} all-reduce(y), replica_groups={{0,2},{1,3}}, to_apply=%add") == ((0, 2), (1, 3))


def test_the_iota_form_is_arange_reshaped_transposed_then_cut():
    line = "x = f32[2]{0} all-reduce(y), replica_groups=[2,3]<=[3,2]T(1,0), to_apply=%add"
    # arange(6).reshape(3, 2).T = [[0, 2, 4], [1, 3, 5]]
    assert parse_groups(line) == ((0, 2, 4), (1, 3, 5))
    assert parse_groups("x = f32[2]{0} all-reduce(y), replica_groups=[1,4]<=[4]") == ((0, 1, 2, 3),)


def _mesh_groups(sizes, ids, over):
    """Plain meaning of the mesh form: for each index of the other axes, the ids along ``over`` (in axis order)."""
    names = list(sizes)
    at = {index: ids[n] for n, index in enumerate(itertools.product(*(range(sizes[a]) for a in names)))}
    rest = [a for a in names if a not in over]
    groups = []
    for fixed in itertools.product(*(range(sizes[a]) for a in rest)):
        group = []
        for moving in itertools.product(*(range(sizes[a]) for a in over)):
            index = dict(zip(rest, fixed)) | dict(zip(over, moving))
            group.append(at[tuple(index[a] for a in names)])
        groups.append(tuple(group))
    return tuple(groups)


def test_the_mesh_form_against_its_plain_meaning():
    # device_ids=([2,2]T(1,0)): arange(4).reshape(2, 2).T flattened = [0, 2, 1, 3]
    line = ("%all-reduce.1 = f32[8,8]{1,0} all-reduce(%f), channel_id=3, replica_groups=mesh['axis_0'=1,'axis_1'=2,"
            "'axis_2'=2], device_ids=([2,2]T(1,0)) {'axis_2'}, use_global_device_ids=true, to_apply=%add")
    sizes = {"axis_0": 1, "axis_1": 2, "axis_2": 2}
    assert parse_groups(line) == _mesh_groups(sizes, [0, 2, 1, 3], ["axis_2"]) == ((0, 2), (1, 3))
    line_1 = line.replace("{'axis_2'}", "{'axis_1'}")
    assert parse_groups(line_1) == _mesh_groups(sizes, [0, 2, 1, 3], ["axis_1"]) == ((0, 1), (2, 3))
    plain = "x = f32[4]{0} all-gather(y), replica_groups=mesh['a'=2,'b'=3] {'a','b'}, dimensions={0}"
    assert parse_groups(plain) == _mesh_groups({"a": 2, "b": 3}, list(range(6)), ["a", "b"])


def test_crossing_and_dcn_only():
    text = "\n".join([
        "%a = f32[16]{0} all-reduce(%g), replica_groups={{0,2},{1,3}}, to_apply=%add",
        "%b = f32[8,8]{1,0} all-gather(%p), replica_groups={{0,1},{2,3}}, dimensions={0}",
        "%c = (f32[4]{0}, bf16[4]{0}) all-reduce(%x, %y), replica_groups={{0,1,2,3}}, to_apply=%add",
        "%d = f32[4]{0} all-reduce-done(%s)",
    ])  # fmt: skip
    found = collectives(text)
    assert [(c.op, c.bytes) for c in found] == [("all-reduce", 64), ("all-gather", 256), ("all-reduce", 24)]
    slice_of = [0, 0, 1, 1]
    across = crossing(found, slice_of)
    assert [c.bytes for c in across] == [64, 24]
    assert [only_over_dcn(c, slice_of) for c in across] == [True, False]
