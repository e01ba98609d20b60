"""Stand-in for vLLM's `vllm.v1.kv_offload.cpu.host_register` (cudaHostRegister of the shared
offload region through vLLM's compiled ops). The tests never pin the region (is_pinned stays
False), so unregistering is never reached; reaching it means a test pinned memory it cannot
unpin here."""


def host_register(ptr: int, size: int) -> None:
    raise NotImplementedError("vLLM's CUDA host registration is not available in this test tree")


def host_unregister(ptr: int) -> None:
    raise NotImplementedError("vLLM's CUDA host registration is not available in this test tree")
