"""The `cuda` backend: PyCUDA context, kernel modules and device memory (see runtime.py)."""
from strata_prefill.fast.cuda.runtime import (  # noqa: F401
    DeviceError,
    alloc,
    arch,
    context,
    cuda_available,
    device_name,
    load_module,
    multiprocessor_count,
    synchronize,
    to_device,
)
