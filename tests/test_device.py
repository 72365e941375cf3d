from __future__ import annotations

import pytest

from wcached.device import resolve_instance
from wcached.errors import DeviceError


def test_cpu_instances() -> None:
    d = resolve_instance("cpu3")
    assert (d.kind, d.instance_id, d.index, d.backend) == ("cpu", "cpu3", 3, "host")


@pytest.mark.parametrize("name", ["gpu0", "cpu", "-1", "GPU_1234", "../etc"])
def test_bad_names(name: str) -> None:
    with pytest.raises(DeviceError, match="is not a device"):
        resolve_instance(name)


def _skip_where_nvml_works() -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception:
        return
    pytest.skip("NVML works here: covered by the GPU tests")


def test_gpu_name_without_nvml_is_a_clear_error() -> None:
    _skip_where_nvml_works()
    with pytest.raises(DeviceError, match=r"NVML could not start|nvidia-ml-py"):
        resolve_instance("0")


def test_isolated_resolution_reports_errors_from_the_child() -> None:
    _skip_where_nvml_works()
    with pytest.raises(DeviceError, match=r"NVML could not start|nvidia-ml-py"):
        resolve_instance("GPU-8d3c0000-0000-0000-0000-000000000000", isolated=True)
    assert resolve_instance("cpu1", isolated=True).instance_id == "cpu1"


def test_nvml_not_ready_is_retried_an_absent_gpu_is_not(monkeypatch) -> None:
    """At boot the unit may start before the driver: NVML failing to start
    (or failing mid-reset) is DeviceNotReady (69, retried); asking for a GPU
    that is not there is DeviceError (78)."""
    import sys
    import types

    from wcached import device
    from wcached.errors import DeviceError, DeviceNotReady

    class NVMLError(Exception):
        pass

    fake = types.SimpleNamespace(NVMLError=NVMLError, nvmlShutdown=lambda: None)

    def not_loaded() -> None:
        raise NVMLError("Driver Not Loaded")

    fake.nvmlInit = not_loaded
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with pytest.raises(DeviceNotReady, match="NVML could not start") as e:
        device._resolve_gpu("0")
    assert e.value.exit_status == 69
    fake.nvmlInit = lambda: None
    fake.nvmlDeviceGetCount = lambda: 1
    with pytest.raises(DeviceError, match="no GPU with index 3") as e:
        device._resolve_gpu("3")
    assert type(e.value) is DeviceError and e.value.exit_status == 78

    def resetting(index: int) -> None:
        raise NVMLError("GPU is lost")

    fake.nvmlDeviceGetHandleByIndex = resetting
    with pytest.raises(DeviceNotReady, match="NVML failed"):
        device._resolve_gpu("0")


def test_the_isolated_resolver_keeps_not_ready_apart_from_absent(monkeypatch) -> None:
    """The daemon resolves a GPU in a child process (no CUDA state in the
    daemon): the child's exit status carries the kind, so NVML not ready at
    boot stays retried (69) and a GPU that is not there stays 78."""
    import subprocess

    from wcached import device
    from wcached.errors import DeviceNotReady

    def child(status: int, line: str):
        def run(argv, **kw):
            return subprocess.CompletedProcess(argv, status, "", f"Traceback...\n{line}\n")

        return run

    monkeypatch.setattr(
        device.subprocess, "run", child(69, "instance '0' is a GPU, but NVML could not start")
    )
    with pytest.raises(DeviceNotReady, match="NVML could not start") as e:
        device._resolve_gpu_isolated("0")
    assert e.value.exit_status == 69
    monkeypatch.setattr(device.subprocess, "run", child(78, "instance '3': no GPU with index 3 (1 present)"))
    with pytest.raises(DeviceError, match="no GPU with index 3") as e:
        device._resolve_gpu_isolated("3")
    assert type(e.value) is DeviceError and e.value.exit_status == 78


def test_a_uuid_of_a_gpu_the_driver_lists_is_its_own_id_without_nvml(monkeypatch, tmp_path) -> None:
    """A client names a GPU by its UUID (the vLLM plugin does): where the
    driver lists that GPU, that is the daemon's socket name already, so no
    NVML start-up is on the attach path. A UUID of no GPU here, a MIG slice
    and any other spelling go through NVML, which says what is wrong (here:
    the stand-in NVML that cannot start)."""
    import sys
    import types

    from wcached import device

    class NVMLError(Exception):
        pass

    def never(*a: object) -> None:
        raise NVMLError("NVML was asked")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(NVMLError=NVMLError, nvmlInit=never))
    gpu = "GPU-8d3c0a1b-2c3d-4e5f-8a9b-0c1d2e3f4a5b"
    absent = "GPU-00000000-2c3d-4e5f-8a9b-0c1d2e3f4a5b"
    mig = "MIG-1f2e3d4c-5b6a-4978-8a9b-0c1d2e3f4a5b"
    # The driver's procfs as it reads on a host with one GPU.
    listed = tmp_path / "gpus" / "0000:18:00.0"
    listed.mkdir(parents=True)
    (listed / "information").write_text(
        f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\nGPU UUID: \t {gpu}\nBus Type: \t PCIe\n"
    )
    (tmp_path / "gpus" / "0000:19:00.0").mkdir()  # no information file: skipped
    monkeypatch.setattr(device, "DRIVER_GPUS", str(tmp_path / "gpus"))
    device.instance_id_for.cache_clear()
    try:
        assert device.instance_id_for(gpu) == gpu
        for other in (absent, mig, gpu + "\n", gpu.upper(), "GPU-8d3c0a1b", gpu + "0", "0"):
            with pytest.raises(DeviceError, match="NVML could not start"):
                device.instance_id_for(other)
        # Without the driver's procfs (a container), NVML answers for all.
        monkeypatch.setattr(device, "DRIVER_GPUS", str(tmp_path / "nowhere"))
        device.instance_id_for.cache_clear()
        with pytest.raises(DeviceError, match="NVML could not start"):
            device.instance_id_for(gpu)
    finally:
        device.instance_id_for.cache_clear()
