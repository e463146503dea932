"""The fake daemon's users, as the legacy daemon serves them: one server at a time, clients
of another UID wait in the pending list; multi-user mode runs several UIDs at once; the
pinned-memory limit binds per client process."""

from __future__ import annotations

from tests.unit.mps.test_fake_daemon import World

PENDING = "Server is not ready, push client to pending list"


def texts(world: World) -> list[str]:
    """The control log's texts, without their ``[time Control pid]`` prefix."""
    return [line.split("] ", 1)[1] for line in world.control]


def served(world: World) -> dict[int, list[int]]:
    """Server PID -> its clients, as the real commands answer."""
    return {
        int(pid): [int(c) for c in world.say(f"get_client_list {pid}").split()]
        for pid in world.say("get_server_list").split()
    }


def test_a_second_uid_waits_then_runs_after_the_first_uids_clients_end() -> None:
    world = World()
    first = int(world.say("fake_connect_client 700 1000"))
    world.say("fake_connect_client 701 1000")
    start = len(world.control)

    assert world.say("fake_connect_client 800 2000") == "pending\n"
    assert world.say("fake_pending") == "800 2000\n"
    assert served(world) == {first: [700, 701]}, "the waiting client is in no list"
    assert len(world.say("ps").splitlines()) == 3, "header and the two clients of 1000"

    world.say("fake_disconnect_client 700")
    assert served(world) == {first: [701]}, "the server stays while it has clients"
    world.say("fake_disconnect_client 701")

    (second,) = served(world)
    assert served(world) == {second: [800]}
    assert world.say("fake_pending") == ""
    assert world.stopped == [first]
    assert texts(world)[start:] == [
        f"NEW CLIENT 800 from user 2000: {PENDING}",
        f"Server {first} exited with status 0",
        f"Starting new server {second} for user 2000",
        f"NEW SERVER {second}: Ready",
    ]
    assert any(f"Server {second:5d}] New client 800 connected" in line for line in world.server)


def test_a_new_client_of_the_exiting_servers_uid_waits_its_turn() -> None:
    """The server asked to exit takes no new client (the reference is silent here: the
    conservative reading); the client is served after the UIDs queued before it."""
    world = World()
    first = int(world.say("fake_connect_client 700 1000"))
    world.say("fake_connect_client 800 2000")
    assert world.say("fake_connect_client 701 1000") == "pending\n"
    assert world.say("fake_pending") == "800 2000\n701 1000\n"
    assert f"NEW CLIENT 701 from user 1000: {PENDING}" in texts(world)
    assert served(world) == {first: [700]}

    world.say("fake_disconnect_client 700")
    (second,) = served(world)
    assert served(world) == {second: [800]}, "2000 queued first, served first"
    world.say("fake_disconnect_client 800")
    (third,) = served(world)
    assert third not in (first, second)
    assert served(world) == {third: [701]}, "then 1000 again, on a fresh server"
    assert world.stopped == [first, second]


def test_the_same_uid_joins_its_running_server_at_once() -> None:
    world = World()
    server = int(world.say("fake_connect_client 700 1000"))
    assert int(world.say("fake_connect_client 701 1000")) == server
    assert world.say("fake_pending") == ""
    assert texts(world)[-1] == "NEW CLIENT 701 from user 1000: Server already exists"
    assert served(world) == {server: [700, 701]}


def test_an_idle_server_of_another_uid_exits_at_once() -> None:
    world = World()
    first = int(world.say("fake_connect_client 700 1000"))
    world.say("fake_disconnect_client 700")
    second = int(world.say("fake_connect_client 800 2000"))
    assert served(world) == {second: [800]}
    assert world.stopped == [first]


def test_multi_user_mode_runs_several_uids_at_once() -> None:
    world = World(multi_user=True)
    first = int(world.say("fake_connect_client 700 1000"))
    second = int(world.say("fake_connect_client 800 2000"))
    third = int(world.say("fake_connect_client 701 1000"))
    assert third == first != second
    assert served(world) == {first: [700, 701], second: [800]}
    assert world.say("fake_pending") == ""
    assert not any(PENDING in text for text in texts(world))
    assert world.stopped == []


def test_a_waiting_client_that_leaves_before_its_turn() -> None:
    world = World()
    first = int(world.say("fake_connect_client 700 1000"))
    world.say("fake_connect_client 800 2000")
    assert world.say("fake_disconnect_client 800") == ""
    assert world.say("fake_pending") == ""
    assert world.say("fake_disconnect_client 800") == "Client 800 not found\n"

    world.say("fake_disconnect_client 700")
    assert served(world) == {}, "asked to exit, the server goes; nobody waits for a new one"
    assert world.stopped == [first]
    assert sum(text.startswith("Starting new server") for text in texts(world)) == 1


def test_a_fault_while_another_uid_waits_starts_it_after_the_faulted_server_exits() -> None:
    world = World()
    first = int(world.say("fake_connect_client 700 1000"))
    world.say("fake_connect_client 701 1000")
    assert world.say("fake_connect_client 800 2000") == "pending\n"
    world.say(f"fake_fault {first}")
    assert world.say("fake_connect_client 702 1000").startswith("refused")
    assert world.say("fake_pending") == "800 2000\n", "a refused client does not wait"
    world.say(f"terminate_client {first} 700")
    assert served(world) == {first: [701]}
    start = len(world.control)

    world.say("fake_disconnect_client 701")
    (second,) = served(world)
    assert served(world) == {second: [800]}
    assert texts(world)[start:] == [
        f"Server {first} exited with status 1",
        f"Starting new server {second} for user 2000",
        f"NEW SERVER {second}: Ready",
    ]


def test_shutdown_server_lets_the_waiting_uid_run() -> None:
    world = World()
    first = int(world.say("fake_connect_client 700 1000"))
    world.say("fake_connect_client 800 2000")
    world.say(f"shutdown_server {first}")
    (second,) = served(world)
    assert served(world) == {second: [800]}


def test_the_pinned_memory_limit_binds_per_client_process() -> None:
    """Four processes of one container, each up to the whole limit: four times it."""
    world = World()
    world.say("set_default_device_pinned_mem_limit 0 1024M")
    clients = [700, 701, 702, 703]
    server = 0
    for client in clients:
        server = int(world.say(f"fake_connect_client {client} 1000"))
    for client in clients:
        assert world.say(f"fake_client_memory {client} 1024") == ""
    assert world.memory[-1] == dict.fromkeys(clients, 1024)
    assert sum(world.memory[-1].values()) == 4 * 1024
    assert world.say("fake_client_memory 700") == "1024\n"
    assert world.say("fake_client_memory 700 1025").startswith("refused: 1025M is over")
    assert world.say("fake_client_memory 700") == "1024\n", "a refused allocation changes nothing"

    world.say(f"set_device_pinned_mem_limit {server} 0 512M")  # new clients only
    world.say("fake_connect_client 704 1000")
    assert world.say("fake_client_memory 704 1024").startswith("refused")
    assert world.say("fake_client_memory 701 1024") == "", "its limit bound when it connected"

    world.say("fake_disconnect_client 700")
    assert world.memory[-1] == dict.fromkeys(clients[1:], 1024)
    assert world.say("fake_client_memory 999 1") == "Client 999 not found\n"


def test_a_waiting_client_holds_no_memory_and_nothing_is_published_unasked() -> None:
    world = World()
    world.say("fake_connect_client 700 1000")
    world.say("fake_connect_client 800 2000")
    assert world.say("fake_client_memory 800 10") == "Client 800 not found\n"
    assert world.memory == [], "no allocation said, nothing published"
