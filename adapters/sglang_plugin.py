"""SGLang's `sglang.srt.plugins` entry point for standardkernels; it lives outside `sk.adapters.sglang` on purpose.

SGLang's `load_plugins()` imports and calls every installed general plugin in each of its processes (the
launcher, every scheduler/TP process). Importing `sk.adapters.sglang` is the user's switch that turns the adapter
on, so the entry point must not import it unless the switch (SK_ADAPTERS, inherited from the launching process)
is already on: installing standardkernels alone leaves SGLang stock. `sk capture` (SK_CAPTURE=1) also
installs its layer recorder here (sk.workflow.sglang_capture), with or without the adapter.
"""
from sk import reports, settings


def register() -> None:
    if settings.get("capture"):
        from sk.workflow import sglang_capture

        sglang_capture.install()
    if reports.is_active("sglang"):
        from sk.adapters.sglang import register as register_sglang

        register_sglang()
