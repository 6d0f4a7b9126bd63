"""
The admission of new connections (Flusher.admit): at most OPENINGS of them
read from at a time until their first bytes are read, a place held
OPENING_HOLD seconds at most by one that sends nothing.
"""

from twisted.internet.task import Clock

from mqttgw.transports.handshake import AWAITING_CONNECT, CLOSED
from mqttgw.transports.schedulers import Flusher


class Connection:
    """What the flusher sees of a connection."""

    def __init__(self, unread=True):
        self.state = AWAITING_CONNECT
        self.opening = False
        self.unread = unread
        self.admissions = 0

    def admitted(self):
        self.admissions += 1


class Port:
    """What the flusher sees of a listening port."""

    def __init__(self):
        self.reading = True

    def stopReading(self):
        self.reading = False

    def startReading(self):
        self.reading = True

    def listening(self):
        return True


def _flusher(openings=3, base=0.0):
    clock = Clock()
    clock.advance(base)
    flusher = Flusher(clock)
    flusher.OPENINGS = openings
    return clock, flusher


def test_new_connections_wait_while_others_are_still_to_be_read():
    clock, flusher = _flusher()
    first = [Connection() for _ in range(3)]
    assert [flusher.admit(c) for c in first] == [True] * 3
    assert all(c.opening for c in first)
    later = [Connection() for _ in range(4)]
    assert not any(flusher.admit(c) for c in later)
    clock.advance(0)
    assert [c.admissions for c in later] == [0] * 4
    # Two are read from: two of those waiting take their places, in order.
    flusher.opened(first[0])
    flusher.opened(first[2])
    assert not first[0].opening and first[1].opening
    clock.advance(0)
    assert [c.admissions for c in later] == [1, 1, 0, 0]
    assert later[0].opening and later[1].opening and not later[2].opening


def test_a_connection_that_sends_nothing_frees_its_place_in_time():
    clock, flusher = _flusher(openings=2)
    silent = [Connection(), Connection()]
    for c in silent:
        assert flusher.admit(c)
    waiting = Connection()
    assert not flusher.admit(waiting)
    clock.advance(flusher.OPENING_HOLD / 2)
    assert waiting.admissions == 0
    clock.advance(flusher.OPENING_HOLD)
    assert waiting.admissions == 1 and waiting.opening
    assert not any(c.opening for c in silent)
    # Only the one admitted holds a place now.
    assert flusher._opening == 1


def test_a_new_connection_finds_the_place_of_one_that_expired():
    clock, flusher = _flusher(openings=1)
    silent = Connection()
    assert flusher.admit(silent)
    clock.advance(flusher.OPENING_HOLD * 2)
    # Nothing waited, so nothing was scheduled: the place is found expired
    # when it is asked for.
    assert flusher.admit(Connection())
    assert not silent.opening


def test_connections_that_closed_while_waiting_are_passed_over():
    clock, flusher = _flusher(openings=1)
    first = Connection()
    assert flusher.admit(first)
    gone, next_one = Connection(), Connection()
    assert not flusher.admit(gone)
    assert not flusher.admit(next_one)
    gone.state = CLOSED
    flusher.opened(first)
    clock.advance(0)
    assert gone.admissions == 0 and next_one.admissions == 1


def test_nothing_is_admitted_while_the_store_holds_reading():
    clock, flusher = _flusher()
    flusher.hold_reading(True)
    held = Connection()
    assert not flusher.admit(held)
    clock.advance(1)
    assert held.admissions == 0
    flusher.hold_reading(False)
    clock.advance(0)
    assert held.admissions == 1


def test_the_record_of_places_does_not_grow_with_connections_read_from():
    _, flusher = _flusher(openings=8)
    for _ in range(10_000):
        c = Connection()
        assert flusher.admit(c)
        flusher.opened(c)
    assert len(flusher._openings) <= 1 and flusher._opening == 0


def test_a_place_is_free_at_its_expiry_whatever_the_clock_reads():
    # At today's epoch a float cannot tell 10 ms apart exactly.
    clock, flusher = _flusher(openings=1, base=1_700_000_000.123)
    assert flusher.admit(Connection())
    waiting = Connection()
    assert not flusher.admit(waiting)
    clock.advance(flusher.OPENING_HOLD)
    assert waiting.admissions == 1


def test_a_client_held_back_by_the_store_takes_no_place_when_let_go():
    clock, flusher = _flusher(openings=2)
    flusher.hold_reading(True)
    # Connected clients whose data came while the store was behind.
    held = [Connection(unread=False) for _ in range(5)]
    for c in held:
        assert not flusher.admit(c)
    flusher.hold_reading(False)
    for _ in range(5):
        clock.advance(0)
    assert all(c.admissions == 1 for c in held)
    assert not any(c.opening for c in held)
    assert flusher._opening == 0 and flusher.room() == 2


def test_a_stopped_port_reads_again_while_other_connections_keep_waiting():
    clock, flusher = _flusher(openings=4)
    port = Port()
    silent = [Connection() for _ in range(4)]
    for c in silent:
        assert flusher.admit(c)
    port.stopReading()
    flusher.wait_for_room(port)
    # A storm of WebSocket or TLS clients keeps connections waiting.
    storm = [Connection() for _ in range(100)]
    for c in storm:
        assert not flusher.admit(c)
    # The places free up: those waiting take half, and the port reads
    # again (what it accepts then waits its turn behind them).
    clock.advance(flusher.OPENING_HOLD)
    assert port.reading
    assert 2 <= sum(c.admissions for c in storm) <= 4
    assert flusher.room() <= 1


def test_the_record_of_places_stays_short_behind_a_silent_connection():
    clock, flusher = _flusher(openings=8)
    silent = Connection()
    assert flusher.admit(silent)
    for _ in range(10_000):
        clock.advance(0.001)
        c = Connection()
        assert flusher.admit(c)
        flusher.opened(c)
    # The silent one lost its place once it had held it OPENING_HOLD; what
    # is recorded covers no more than that last stretch.
    assert not silent.opening and flusher._opening == 0
    assert len(flusher._openings) <= flusher.OPENING_HOLD / 0.001 + 2
