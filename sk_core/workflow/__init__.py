"""The optimization workflow behind `sk`: workloads, scenarios, capture, candidate stubs, kernel bench, end-to-end eval.

    sk list --workloads                      the workloads a scenario can name (LLM.mixed, ...)
    sk capture scenarios/tiny.yaml           operator shapes the engine executes, one JSON per scenario·workload
    sk list --map llama                      operators an architecture uses, and which Standard Kernels cover
    sk create-stubs --architecture llama     candidate modules to edit, in candidates/
    sk bench --target rms_norm [--self-test] baseline vs candidate on every captured shape
    sk eval scenarios/tiny.yaml              stock engine vs our kernels: throughput, latency, token match
"""
