"""The reset's rules over the agent's GPU port: only EXCLUSIVE_PROCESS is changed, each
change is read back, a MIG GPU is left, one GPU's failure does not stop the others."""

from __future__ import annotations

from dataclasses import replace

from agent.core.errors import GpuError
from agent.core.types import Device
from agent.gpu.compute_mode import ComputeMode, reset_exclusive
from agent.gpu.fake import FakeGpuBackend


class Driver:
    """Modes as the driver holds them; the backend's sets go here (``stuck``: a GPU whose
    set is accepted but does not take, ``broken``: one whose mode cannot be read)."""

    def __init__(self, backend: FakeGpuBackend) -> None:
        self.modes: dict[str, ComputeMode] = {}
        self.stuck: set[str] = set()
        self.broken: set[str] = set()
        self.sets: list[str] = []
        original = backend.set_compute_mode

        async def set_mode(device: Device, *, exclusive: bool) -> None:
            await original(device, exclusive=exclusive)
            self.sets.append(device.uuid)
            if device.uuid not in self.stuck:
                self.modes[device.uuid] = (
                    ComputeMode.EXCLUSIVE_PROCESS if exclusive else ComputeMode.DEFAULT
                )

        backend.set_compute_mode = set_mode  # type: ignore[method-assign]

    async def read(self, device: Device) -> ComputeMode:
        if device.uuid in self.broken:
            raise GpuError(f"cannot read the compute mode of {device.uuid}: NVML error 999")
        return self.modes.get(device.uuid, ComputeMode.DEFAULT)


async def test_only_exclusive_process_is_set_and_each_set_is_read_back() -> None:
    backend = FakeGpuBackend.with_gpus(4)
    gpus = await backend.list_devices()
    driver = Driver(backend)
    driver.modes = {
        gpus[0].uuid: ComputeMode.EXCLUSIVE_PROCESS,
        gpus[1].uuid: ComputeMode.EXCLUSIVE_THREAD,
        gpus[2].uuid: ComputeMode.EXCLUSIVE_PROCESS,
    }
    driver.stuck = {gpus[2].uuid}
    driver.broken = {gpus[3].uuid}
    results = await reset_exclusive(backend, driver)
    assert [r.failed for r in results] == [False, False, True, True]
    assert driver.sets == [gpus[0].uuid, gpus[2].uuid]  # the others untouched
    assert driver.modes[gpus[0].uuid] is ComputeMode.DEFAULT
    assert results[1].line().endswith("EXCLUSIVE_THREAD, left as it is")
    assert results[2].error == "set to DEFAULT, but it reads EXCLUSIVE_PROCESS"
    assert "NVML error 999" in results[3].error


async def test_a_mig_gpu_is_named_once_and_left_as_it_is() -> None:
    backend = FakeGpuBackend.with_gpus(2)
    whole, parent = await backend.list_devices()
    slices = [
        replace(parent, uuid=f"MIG-{i}", parent_uuid=parent.uuid, mig_profile="3g.40gb")
        for i in range(2)
    ]
    mig_node = FakeGpuBackend([whole, *slices])
    driver = Driver(mig_node)
    driver.modes = {whole.uuid: ComputeMode.EXCLUSIVE_PROCESS}
    results = await reset_exclusive(mig_node, driver)
    assert [(r.uuid, r.failed) for r in results] == [(whole.uuid, False), (parent.uuid, False)]
    assert "MIG enabled" in results[1].line()
    assert driver.sets == [whole.uuid]
