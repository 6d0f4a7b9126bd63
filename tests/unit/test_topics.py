"""Appendix A: topic names, filters, wildcards, and the subscription trie."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqttgw.broker.topics import (
    InvalidTopic,
    RetainedTree,
    SubscriptionTrie,
    matches,
    validate_topic_filter,
    validate_topic_name,
)
from mqttgw.wire.packets import Publish

MATCHING = [
    ("finance/stock/ibm/#", "finance/stock/ibm"),
    ("finance/stock/ibm/#", "finance/stock/ibm/closingprice"),
    ("finance/stock/ibm/#", "finance/stock/ibm/currentprice"),
    ("finance/#", "finance"),
    ("#", "finance"),
    ("#", "/finance"),
    ("finance/stock/+", "finance/stock/ibm"),
    ("finance/stock/+", "finance/stock/xyz"),
    ("finance/+/ibm", "finance/stock/ibm"),
    ("+/+", "/finance"),
    ("/+", "/finance"),
    ("+", "finance"),
    ("+/#", "finance"),
    ("Accounts payable", "Accounts payable"),
    ("$SYS/#", "$SYS/broker/load"),
    ("$SYS/+", "$SYS/uptime"),
    ("a//b", "a//b"),
    ("a/+/b", "a//b"),
]

NOT_MATCHING = [
    ("finance/stock/+", "finance/stock/ibm/closingprice"),
    ("finance/+", "finance"),
    ("+", "/finance"),
    ("ACCOUNTS", "Accounts"),
    ("/finance", "finance"),
    ("finance", "/finance"),
    ("#", "$SYS/uptime"),
    ("+/uptime", "$SYS/uptime"),
    ("+/#", "$SYS"),
    ("a/b", "a/b/c"),
    ("a/b/c", "a/b"),
]


@pytest.mark.parametrize("topic_filter,topic", MATCHING)
def test_filter_matches_topic(topic_filter, topic):
    assert matches(topic_filter, topic)
    trie = SubscriptionTrie()
    trie.add(topic_filter, "s", 1)
    assert trie.match(topic) == (("s", 1),)


@pytest.mark.parametrize("topic_filter,topic", NOT_MATCHING)
def test_filter_does_not_match_topic(topic_filter, topic):
    assert not matches(topic_filter, topic)
    trie = SubscriptionTrie()
    trie.add(topic_filter, "s", 1)
    assert trie.match(topic) == ()


@pytest.mark.parametrize(
    "topic_filter",
    ["#", "finance/#", "+", "finance/+", "finance/+/ibm", "+/+/#", "/", "a//b", "$SYS/#"],
)
def test_valid_filters(topic_filter):
    validate_topic_filter(topic_filter)


@pytest.mark.parametrize(
    "topic_filter",
    ["", "finance#", "finance/#/closingprice", "finance+", "fin+ance/x", "#/a", "a/b#", "a\x00"],
)
def test_invalid_filters(topic_filter):
    with pytest.raises(InvalidTopic):
        validate_topic_filter(topic_filter)


@pytest.mark.parametrize("name", ["", "a/+", "a/#", "#", "+", "a\x00b"])
def test_invalid_topic_names(name):
    with pytest.raises(InvalidTopic):
        validate_topic_name(name)


@pytest.mark.parametrize("name", ["a", "/", "/finance", "Accounts payable", "a//b", "温度"])
def test_valid_topic_names(name):
    validate_topic_name(name)


def test_overlapping_filters_give_one_entry_at_the_highest_qos():
    trie = SubscriptionTrie()
    trie.add("a/#", "s", 0)
    trie.add("a/+", "s", 2)
    trie.add("a/b", "s", 1)
    trie.add("a/b", "t", 0)
    assert dict(trie.match("a/b")) == {"s": 2, "t": 0}


def test_resubscribing_replaces_the_qos():
    trie = SubscriptionTrie()
    trie.add("a", "s", 2)
    trie.add("a", "s", 0)
    assert trie.match("a") == (("s", 0),)
    assert trie.count == 1


def test_match_cache_is_invalidated_by_changes():
    trie = SubscriptionTrie()
    assert trie.match("a/b") == ()
    trie.add("a/+", "s", 1)
    assert trie.match("a/b") == (("s", 1),)
    trie.remove("a/+", "s")
    assert trie.match("a/b") == ()


def test_remove_prunes_empty_branches_and_reports_misses():
    trie = SubscriptionTrie()
    trie.add("a/b/c", "s", 0)
    assert not trie.remove("a/b", "s")
    assert not trie.remove("a/b/c", "t")
    assert trie.remove("a/b/c", "s")
    assert trie._root.children == {}
    assert trie.count == 0


def test_match_cache_is_bounded_by_bytes():
    trie = SubscriptionTrie(cache_bytes=64 * 1024)
    trie.add("#", "s", 0)
    for i in range(1000):
        trie.match(f"t/{i}")
    assert 0 < trie._cached_bytes <= 64 * 1024
    assert sum(len(t) for t in trie._cache) < 64 * 1024


def test_match_cache_does_not_keep_very_long_topics():
    trie = SubscriptionTrie(cache_bytes=64 * 1024)
    trie.add("#", "s", 0)
    for i in range(100):
        assert trie.match(f"{i}/" + "x" * 60_000) == (("s", 0),)
    assert trie._cache == {}


levels = st.lists(st.sampled_from(["a", "b", "", "$x"]), min_size=1, max_size=4)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(["a", "b", "", "+", "#"]), min_size=1, max_size=4),
        min_size=1,
        max_size=6,
    ),
    levels,
)
def test_trie_agrees_with_matches(filters, topic_levels):
    topic = "/".join(topic_levels)
    trie = SubscriptionTrie()
    expected = set()
    for i, f in enumerate(filters):
        topic_filter = "/".join(f)
        try:
            validate_topic_filter(topic_filter)
        except InvalidTopic:
            continue
        trie.add(topic_filter, i, 0)
        if matches(topic_filter, topic):
            expected.add(i)
    assert {s for s, _ in trie.match(topic)} == expected


def retained_tree(topics):
    tree = RetainedTree()
    for topic in topics:
        tree.set(topic, Publish(topic, b"v", 1, True))
    return tree


def walked(tree, filters):
    return [(m.topic, q) for m, q in filter(None, tree.walk(filters))]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(levels.map("/".join), max_size=30),
    st.lists(
        st.lists(st.sampled_from(["a", "b", "", "+", "#"]), min_size=1, max_size=4)
        .map("/".join)
        .filter(lambda f: "#" not in f[:-1]),
        min_size=1,
        max_size=4,
    ),
)
def test_retained_walk_gives_each_matching_topic_once_at_the_highest_qos(topics, filters):
    tree = retained_tree(topics)
    requests = [(f, qos % 3) for qos, f in enumerate(filters)]
    got = walked(tree, requests)
    expected = {}
    for topic in set(topics):
        granted = [q for f, q in requests if matches(f, topic)]
        if granted:
            expected[topic] = max(granted)
    assert dict(got) == expected
    assert len(got) == len(expected)


def test_retained_walk_is_parent_first():
    tree = retained_tree(["a/b/c", "a/b", "x", "a", "a/c"])
    order = [t for t, _ in walked(tree, [("#", 0)])]
    assert order.index("a") < order.index("a/b") < order.index("a/b/c")
    assert order.index("a") < order.index("a/c")


def test_retained_walk_visits_only_the_matching_branch():
    tree = retained_tree([f"a/{i}/{j}" for i in range(100) for j in range(100)])
    steps = list(tree.walk([("a/7/+", 1)], step=1))
    assert sorted(t.topic for t, _ in filter(None, steps)) == sorted(
        f"a/7/{j}" for j in range(100)
    )
    # A step per node on the way (the root, a, a/7 and its 100 children)
    # and per child the wildcard expands to.
    assert steps.count(None) == 203


def test_retained_walk_spreads_a_wide_expansion_over_steps():
    # 500 wildcard filters meeting 100 children make 50,000 filter states
    # at one node: that is work between steps too, not one long stretch.
    tree = retained_tree([f"w/{i}/{j}" for i in range(100) for j in range(5)])
    filters = [(f"w/+/{j}", 0) for j in range(500)]
    steps = list(tree.walk(filters, step=256))
    assert sorted(t.topic for t, _ in filter(None, steps)) == sorted(
        f"w/{i}/{j}" for i in range(100) for j in range(5)
    )
    assert steps.count(None) >= 500 * 100 // 256


def test_retained_walk_keeps_dollar_topics_from_leading_wildcards():
    tree = retained_tree(["$SYS/x", "a"])
    assert walked(tree, [("#", 0), ("+/x", 0)]) == [("a", 0)]
    assert walked(tree, [("$SYS/#", 0)]) == [("$SYS/x", 0)]


def test_retained_tree_delete_prunes_and_counts():
    tree = retained_tree(["a/b/c", "a"])
    tree.delete("a/b/c")
    tree.delete("nope")
    assert len(tree) == 1 and tree.get("a/b/c") is None
    assert tree._root.children["a"].children == {}
    assert [m.topic for m in tree] == ["a"]
