"""How much memory a large Value or Array may still take: the machine's, within a control
group's limit, counted as the kernel would give it (files written here stand for /proc
and /sys)."""
from __future__ import annotations

import pytest

from fiberlite.runtime.shm import room

GiB = 1 << 30


@pytest.fixture
def system(tmp_path, monkeypatch):
    """Write ``meminfo`` and a cgroup v2 ``memory.max``/``current``/``stat`` for the room."""
    def write(available: int, swap_free: int = 0, limit: str = "max", usage: int = 0,
              inactive_file: int = 0) -> None:
        (tmp_path / "meminfo").write_text(
            f"MemTotal: 99999999 kB\nMemAvailable: {available // 1024} kB\n"
            f"SwapFree: {swap_free // 1024} kB\n")
        (tmp_path / "max").write_text(f"{limit}\n")
        (tmp_path / "current").write_text(f"{usage}\n")
        (tmp_path / "stat").write_text(f"anon 1\ninactive_file {inactive_file}\nactive_file 7\n")
    monkeypatch.setattr(room, "_MEMINFO", str(tmp_path / "meminfo"))
    monkeypatch.setattr(room, "_CGROUP_LIMITS", ((str(tmp_path / "max"), str(tmp_path / "current"),
                                                   str(tmp_path / "stat"), "inactive_file"),))
    return write


def test_without_a_limit_it_is_the_machines_available_memory_and_swap(system):
    system(available=10 * GiB, swap_free=2 * GiB)
    assert room.available() == 12 * GiB


def test_a_containers_limit_counts_its_file_cache_as_free(system):
    system(available=10 * GiB, limit=str(4 * GiB), usage=3 * GiB, inactive_file=2 * GiB)
    assert room.available() == 3 * GiB  # 4 GiB less 1 GiB really used


def test_the_machine_bounds_a_generous_limit(system):
    system(available=1 * GiB, limit=str(64 * GiB), usage=0)
    assert room.available() == 1 * GiB


def test_a_segment_larger_than_the_room_is_refused_with_what_to_do(system):
    system(available=1 * GiB, limit=str(2 * GiB), usage=1536 << 20)
    room.check_room(256 << 20)  # fits
    with pytest.raises(MemoryError, match=r"cannot allocate 1\.0 GiB .* about 512\.0 MiB is available"):
        room.check_room(GiB)
