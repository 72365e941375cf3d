from wcached.loaders.layout import plan_layout


def test_packs_aligned_and_splits_at_segment_size() -> None:
    placements, sizes = plan_layout([("a", 10), ("b", 100), ("c", 200), ("d", 0)], 512, 256)
    assert [(p.name, p.segment, p.offset) for p in placements] == [
        ("a", 0, 0),
        ("b", 0, 256),
        ("c", 1, 0),
        ("d", 1, 256),
    ]
    assert sizes == [356, 256]


def test_oversized_tensor_gets_its_own_segment() -> None:
    placements, sizes = plan_layout([("small", 8), ("big", 5000), ("after", 8)], 1024, 64)
    assert [(p.segment, p.offset) for p in placements] == [(0, 0), (1, 0), (2, 0)]
    assert sizes == [8, 5000, 8]
    placements, sizes = plan_layout([("big", 5000)], 1024, 64)
    assert sizes == [5000]
