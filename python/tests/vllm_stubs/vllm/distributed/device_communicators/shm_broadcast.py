"""Stand-in for vLLM's `vllm.distributed.device_communicators.shm_broadcast`, which needs
torch.distributed and zmq initialised. SharedOffloadRegion imports only check_shm_free_space:
refuse a /dev/shm region larger than the free space there, as vLLM's does."""

import os


def check_shm_free_space(required_bytes: int, path: str = "/dev/shm") -> None:
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    if required_bytes > free:
        raise RuntimeError(
            f"{path} has {free} bytes free, the offload region needs {required_bytes}"
        )
