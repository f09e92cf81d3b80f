"""The discrete-event core: a heap ordered by (time, insertion), events that return events, and
state kept per simulator instance."""

import pytest

from rpeg.sim.core import Simulator


class Note:
    """An event that logs (time, label) when it fires and returns the events it was given."""

    def __init__(self, label, log, then=()):
        self.label, self.log, self.then = label, log, list(then)

    def fire(self, sim):
        self.log.append((sim.now, self.label))
        return self.then


class Forever:
    """An event that schedules itself again a second later, for ever."""

    def fire(self, sim):
        return [(sim.now + 1.0, self)]


def test_events_fire_in_time_order_and_run_returns_the_last_time():
    sim, log = Simulator(), []
    for t, label in [(3.0, "c"), (1.0, "a"), (2.5, "b"), (0.0, "start")]:
        sim.at(t, Note(label, log))
    assert sim.run() == 3.0
    assert log == [(0.0, "start"), (1.0, "a"), (2.5, "b"), (3.0, "c")]
    assert sim.now == 3.0 and sim.fired == 4


def test_ties_fire_in_insertion_order():
    sim, log = Simulator(), []
    for label in "edcba":
        sim.at(1.0, Note(label, log))
    sim.at(0.5, Note("early", log))
    sim.at(1.0, Note("last", log))
    sim.run()
    assert [label for _, label in log] == ["early", "e", "d", "c", "b", "a", "last"]


def test_events_an_event_returns_are_scheduled_and_run():
    sim, log = Simulator(), []
    later, sooner = Note("later", log), Note("sooner", log)
    same_time = Note("same time", log)
    sim.at(1.0, Note("parent", log, then=[(4.0, later), (2.0, sooner), (1.0, same_time)]))
    sim.at(1.0, Note("queued before", log))
    assert sim.run() == 4.0
    # a child at the parent's own time runs after what was queued for that time already
    assert log == [(1.0, "parent"), (1.0, "queued before"), (1.0, "same time"), (2.0, "sooner"), (4.0, "later")]
    assert sim.fired == 5


def test_an_event_returning_none_is_fine():
    class Quiet:
        def fire(self, sim):
            return None

    sim = Simulator()
    sim.at(2.0, Quiet())
    assert sim.run() == 2.0 and sim.fired == 1


def test_scheduling_in_the_past_raises():
    sim, log = Simulator(), []
    sim.at(5.0, Note("x", log))
    sim.run()
    with pytest.raises(ValueError, match="in the past"):
        sim.at(4.0, Note("too late", log))
    sim.at(5.0, Note("now is fine", log))  # exactly now is allowed
    assert sim.run() == 5.0
    # an event that returns one in the past fails the run as well
    sim2 = Simulator()
    sim2.at(3.0, Note("parent", [], then=[(2.0, Note("child", []))]))
    with pytest.raises(ValueError, match="in the past"):
        sim2.run()


def test_two_simulators_share_no_sequence_numbers_or_state():
    a, b = Simulator(), Simulator()
    log_a, log_b = [], []
    for i in range(5):  # interleave scheduling: each keeps its own insertion order
        a.at(1.0, Note(f"a{i}", log_a))
        b.at(1.0, Note(f"b{4 - i}", log_b))
    assert [seq for _, seq, _ in sorted(b._heap)] == [0, 1, 2, 3, 4]  # b numbers from 0 whatever a did
    assert a.run() == 1.0
    assert a.fired == 5 and b.fired == 0 and b.now == 0.0 and log_b == []
    b.run()
    assert [label for _, label in log_a] == ["a0", "a1", "a2", "a3", "a4"]
    assert [label for _, label in log_b] == ["b4", "b3", "b2", "b1", "b0"]
    c = Simulator()  # a fresh one starts from scratch
    assert c.now == 0.0 and c.fired == 0 and c._heap == []
    c.at(0.0, Note("c", []))
    assert c._heap[0][1] == 0


def test_max_events_guards_a_run_that_never_ends():
    sim = Simulator()
    sim.at(0.0, Forever())
    with pytest.raises(RuntimeError, match="within 100 events"):
        sim.run(max_events=100)
    assert sim.fired == 101 and sim.now == 100.0


def test_a_run_of_exactly_max_events_finishes():
    sim, log = Simulator(), []
    for i in range(100):
        sim.at(float(i), Note(i, log))
    assert sim.run(max_events=100) == 99.0
    assert len(log) == 100
