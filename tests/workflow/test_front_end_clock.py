"""The front-end clock of timed vLLM batches: what it times and that it leaves the engine as it found it."""
import gc
import time
from types import SimpleNamespace

from sk.workflow.front_end_clock import front_end_clock


class Core:
    def __init__(self, steps):
        self.steps = steps

    def get_output(self):
        time.sleep(0.01)
        self.steps -= 1
        return SimpleNamespace(outputs=[1] if self.steps >= 0 else [], timestamp=time.monotonic() - 0.5)


class Processor:
    def process_outputs(self, outputs, **kwargs):
        time.sleep(0.02)
        return outputs


def test_waits_processing_gc_and_lag_are_timed_and_the_engine_is_restored():
    engine = SimpleNamespace(engine_core=Core(3), output_processor=Processor())
    callbacks = list(gc.callbacks)
    with front_end_clock(engine) as clock:
        for _ in range(4):
            engine.output_processor.process_outputs(engine.engine_core.get_output().outputs)
        gc.collect()
    assert clock["steps"] == 4
    assert 0.04 <= clock["wait_s"] < 0.5 and 0.08 <= clock["process_s"] < 0.5
    assert clock["gc_collections"] >= 1 and clock["gc_s"] > 0
    # The last step with outputs was the third (3 waits and 2 processings in); the engine core stamped it half a
    # second before it was read.
    assert 0.07 <= clock["last_output_s"] < 0.5 and 0.5 <= clock["lag_s"] < 1.0
    assert "get_output" not in vars(engine.engine_core) and "process_outputs" not in vars(engine.output_processor)
    assert gc.callbacks == callbacks


def test_an_engine_without_those_parts_is_left_alone():
    engine = SimpleNamespace(engine_core=SimpleNamespace())
    with front_end_clock(engine) as clock:
        pass
    assert "unavailable" in clock and "get_output" in clock["unavailable"]
    assert vars(engine.engine_core) == {}
