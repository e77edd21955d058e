"""The simulated host's stand-ins are rewritten safely while another start reads them: two starts of one
run name at once (a twin, a racing --replace) write the same folder the other's pre-flight is reading."""

import os
import threading

from rlbox.cluster import sim


def test_a_second_write_of_the_same_host_touches_nothing(tmp_path):
    folder = sim.write_stand_ins(tmp_path / "sim0", "a3", 16, "25.3.rc1")
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}
    link = os.readlink(folder / "dev")
    sim.write_stand_ins(tmp_path / "sim0", "a3", 16, "25.3.rc1")
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()} == before
    assert os.readlink(folder / "dev") == link
    assert os.access(folder / "npu-smi", os.X_OK) and os.access(folder / "driver" / "tools" / "hccn_tool", os.X_OK)


def test_a_changed_host_is_swapped_in_and_leaves_no_old_listing(tmp_path):
    folder = sim.write_stand_ins(tmp_path / "sim0", "a2", 8, "25.3.rc1")
    sim.write_stand_ins(tmp_path / "sim0", "a2", 4, "25.2.0")
    assert sorted(p.name for p in (folder / "dev").iterdir() if p.name.startswith("davinci") and p.name[7:].isdigit()) \
        == [f"davinci{i}" for i in range(4)]
    assert "Version=25.2.0" in (folder / "driver" / "version.info").read_text()
    used = os.readlink(folder / "dev")
    hidden = sorted(p.name for p in folder.iterdir() if p.name.startswith("."))
    assert len(hidden) == 2 and used in hidden  # the listing in use and the one replaced (a reader may be in it)
    for old in hidden:  # no half-written files; a listing replaced over a minute ago goes at the next change
        os.utime(folder / old, (1, 1))
    sim.write_stand_ins(tmp_path / "sim0", "a2", 6, "25.2.0")
    # the first listing went; the one replaced now stays its minute
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == sorted([used, os.readlink(folder / "dev")])


def test_a_listing_made_long_ago_is_kept_a_minute_after_it_is_replaced(tmp_path):
    folder = sim.write_stand_ins(tmp_path / "sim0", "a2", 8, "25.3.rc1")
    old = os.readlink(folder / "dev")
    os.utime(folder / old, (1, 1))  # made by a start long ago
    sim.write_stand_ins(tmp_path / "sim0", "a2", 4, "25.3.rc1")
    assert (folder / old / "davinci7").exists()  # a pre-flight that resolved the link just before may be in it


def test_a_folder_listing_from_before_is_replaced(tmp_path):
    (tmp_path / "sim0" / "dev").mkdir(parents=True)
    (tmp_path / "sim0" / "dev" / "davinci0").touch()
    folder = sim.write_stand_ins(tmp_path / "sim0", "a2", 2, "25.3.rc1")
    assert (folder / "dev").is_symlink() and (folder / "dev" / "davinci1").exists()


def test_a_reader_never_finds_the_listing_missing_while_hosts_change(tmp_path):
    folder = sim.write_stand_ins(tmp_path / "sim0", "a2", 8, "25.3.rc1")
    misses, done = [], threading.Event()

    def read():
        while not done.is_set():
            try:
                names = [p.name for p in (folder / "dev").iterdir()]
                if "davinci0" not in names:
                    misses.append(names)
                (folder / "npu-smi").read_text().index("esac")
            except (OSError, ValueError) as err:
                misses.append(repr(err))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(200):
            sim.write_stand_ins(tmp_path / "sim0", "a2", 4 + i % 5, "25.3.rc1")
    finally:
        done.set()
        reader.join()
    assert misses == []


def test_the_hccn_tool_stand_in_is_one_process_like_the_real_tool(tmp_path):
    """A pre-flight asks it three questions an NPU: with no PATH it must still answer (no sed, grep or dirname)."""
    import subprocess

    folder = sim.write_stand_ins(tmp_path / "sim0", "a2", 8, "25.3.rc1", host_index=2)
    (folder / "hccn-standin.faults").write_text("link 3 DOWN\nhealth 5 Init\nnoip 6\nunreachable 192.168.101.1\n")
    tool = str(folder / "driver" / "tools" / "hccn_tool")

    def ask(*argv):
        p = subprocess.run(["/bin/sh", tool, *argv], capture_output=True, text=True, env={"PATH": "/nonexistent"})
        return p.returncode, p.stdout, p.stderr

    assert ask("-i", "2", "-ip", "-g") == (0, "ipaddr:192.168.102.2\nnetmask:255.255.255.0\n", "")
    assert ask("-i", "3", "-link", "-g") == (0, "link status: DOWN\n", "")
    assert ask("-i", "4", "-link", "-g") == (0, "link status: UP\n", "")
    assert ask("-i", "5", "-net_health", "-g") == (0, "net health status: Init\n", "")
    assert ask("-i", "4", "-net_health", "-g") == (0, "net health status: Success\n", "")
    assert ask("-i", "6", "-ip", "-g") == (1, "", "Get ip failed, ret:-2\n")
    assert "0 received" in ask("-i", "1", "-ping", "-g", "address", "192.168.101.1")[1]
    assert "3 received" in ask("-i", "1", "-ping", "-g", "address", "192.168.101.3")[1]
