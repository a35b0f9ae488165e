"""Engine adapters: make vLLM's and SGLang's own layers run Standard Kernels ops in every engine process."""
