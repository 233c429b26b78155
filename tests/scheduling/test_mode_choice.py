"""The load-aware mode chooser: explores a load level it has not measured (diffusion first), then
picks the mode with more finished rows per second at that level."""
from dgemma_struct.scheduling.mode_choice import ModeChooser


def test_explores_then_picks_the_faster_mode_per_load_level():
    c = ModeChooser(min_seconds=1.0)
    assert c.pick(1) == "diffusion"                      # nothing measured: diffusion first
    c.record("diffusion", rows=1, seconds=2.0, finished=20)
    assert c.pick(1) == "ar"                             # AR not measured at this level yet
    c.record("ar", rows=1, seconds=2.0, finished=8)
    assert c.pick(1) == "diffusion"                      # 10/s against 4/s
    c.record("diffusion", rows=40, seconds=2.0, finished=20)
    c.record("ar", rows=40, seconds=2.0, finished=90)
    assert c.pick(40) == "ar" and c.pick(33) == "ar"     # same level (32-63 rows)
    assert c.pick(1) == "diffusion"                      # the small-load level keeps its own answer
    assert c.summary()["ar"]["6"] == 45.0 and c.picks["ar"] >= 3


def test_too_little_time_measured_is_not_a_measurement():
    c = ModeChooser(min_seconds=5.0)
    c.record("diffusion", rows=4, seconds=1.0, finished=100)
    c.record("ar", rows=4, seconds=10.0, finished=10)
    assert c.rate("diffusion", 4) is None and c.pick(4) == "diffusion"
