"""Our kernels' GPU launch path on a machine without a GPU: the compiled binaries faked, the rest real.

For a process started with ``TRITON_INTERPRET=0`` (the GPU's branches, configs and launch arguments): ``install()``
fakes what only a GPU has (the driver's current device and stream, an H200's compute capability, the compiled
binary) and makes ``kernels.direct_launch.LAUNCHES`` a launch cache over the real ``TritonRuntime`` code, so every
line of ``ssd_prefill``, of the launch cache and of ``kernels.call_replay`` runs as on the GPU. A launch key's first
launch binds a ``FakeBinary`` where Triton would compile and launch; the binaries' launchers record their arguments
(``RUNS``). Used by ``tests/replay_equivalence.py`` and ``lab/host_time_proxy.py``.
"""

from __future__ import annotations

import torch

from kernels import direct_launch

RUNS: list[tuple] = []  # (binary, grid, arguments) of every fake launch, while ``RECORDING[0]``
RECORDING = [False]
ADDRESS = "address"  # an argument that is a tensor's address is recorded as (ADDRESS, the address)


class FakeBinary:
    """A compiled kernel whose launcher records its arguments (``CompiledKernel.run``'s signature)."""

    function = packed_metadata = None

    def __init__(self, name: str):
        self.name = name
        self.addresses: frozenset[int] = frozenset()  # the positions of the tensors' addresses (``FakeRuntime.bind``)

    def run(self, grid_0, grid_1, grid_2, stream, function, metadata, launch_metadata, enter, exit, *arguments):
        if RECORDING[0]:
            RUNS.append((self.name, (grid_0, grid_1, grid_2),
                         tuple((ADDRESS, v) if i in self.addresses else v for i, v in enumerate(arguments))))


class FakeRuntime(direct_launch.TritonRuntime):
    """``TritonRuntime`` with the driver faked (device 0, stream 0) and every tensor taken as a GPU's, as a binding
    of CUDA tensors is (their addresses go to the launcher). Everything else is the real code."""

    def device(self) -> int:
        return 0

    def stream(self, device: int) -> int:
        return 0

    def bind(self, kernel, arguments, result, device):
        binding = super().bind(kernel, arguments, result, device)
        if binding is not None:
            binding.address_names = tuple(name for name, v in arguments.items() if isinstance(v, torch.Tensor))
            result.addresses = frozenset(i for i, p in enumerate(binding.params) if p in binding.address_names)
        return binding


class FakeBinaryLaunchCache(direct_launch.LaunchCache):
    """A key's first launch binds a fake binary instead of compiling and launching through Triton: the autotuner's
    pick (its first config after pruning) goes into its cache as ``Autotuner.run`` would put it, the binary into the
    JIT function's device cache, so the real ``bind`` and ``current`` accept them. That first launch runs nothing."""

    def _through_triton(self, kernel, grid, arguments, bind_as):
        self.through_triton += 1
        tuner, jit = self.runtime.layers(kernel)
        if tuner is not None and len(tuner.configs) > 1:
            tuner.nargs = {}  # as ``Autotuner.run`` sets it for a launch by keyword
            tuner.best_config = tuner.prune_configs(dict(arguments))[0]
            tuner.nargs = None
            tuner.cache[direct_launch.tuning_key_of(tuner, arguments)] = tuner.best_config
        elif tuner is not None:
            tuner.best_config = tuner.configs[0]
        binary = FakeBinary(jit.__name__)
        if 0 not in jit.device_caches:  # Triton's factory asks the driver for the target: only [0] is read here
            jit.device_caches[0] = ({},)
        jit.device_caches[0][0][("fake", len(jit.device_caches[0][0]))] = binary
        if bind_as is not None:
            key, device = bind_as
            binding = self.runtime.bind(kernel, arguments, binary, device)
            if binding is None:
                raise RuntimeError(f"{jit.__name__}: the launch cache would not bind this launch")
            self._launches += 1
            self.bindings[key] = [binding, self._launches]
        return binary


def install() -> FakeBinaryLaunchCache:
    """Fake the GPU for this process (module docstring); returns the launch cache now in use."""
    from kernels.backend import INTERPRET

    if INTERPRET:
        raise RuntimeError("the fake GPU needs TRITON_INTERPRET=0 (the GPU's code paths), set before kernels loads")
    torch.cuda.get_device_capability = lambda *device: (9, 0)  # an H200's: its configs, programmatic launch on
    direct_launch.LAUNCHES = FakeBinaryLaunchCache(FakeRuntime())
    return direct_launch.LAUNCHES
