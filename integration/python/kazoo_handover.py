"""Graceful handover with kazoo's Election recipe, for bench_handover.

Usage: kazoo_handover.py HOSTS PATH RUNS

Two clients take turns, in this one process. Each run, the holder's election function
waits; the waiter's Election.run is started and given 0.3 s to queue its lock node;
then the holder's function is told to return (t0), after which kazoo deletes its lock
node and the waiter's function runs (t1). Prints one line per run: t1 - t0 in
microseconds.
"""

import sys
import threading
import time

from kazoo.client import KazooClient
from kazoo.recipe.election import Election


def main() -> None:
    hosts, path, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    clients = [KazooClient(hosts=hosts), KazooClient(hosts=hosts)]
    for c in clients:
        c.start(timeout=30)
    elections = [Election(c, path, f"c{i}") for i, c in enumerate(clients)]

    holding = threading.Event()
    let_go = threading.Event()

    def hold() -> None:
        holding.set()
        let_go.wait()

    first = threading.Thread(target=elections[0].run, args=(hold,))
    first.start()
    if not holding.wait(30):
        sys.exit("kazoo: the first candidate was not elected within 30 s")

    current = first
    for run in range(runs):
        waiter = elections[(run + 1) % 2]
        granted = {}
        next_holding = threading.Event()
        next_let_go = threading.Event()

        def take(granted=granted, ev=next_holding, go=next_let_go) -> None:
            granted["at"] = time.perf_counter()
            ev.set()
            go.wait()

        thread = threading.Thread(target=waiter.run, args=(take,))
        thread.start()
        time.sleep(0.3)
        t0 = time.perf_counter()
        let_go.set()
        if not next_holding.wait(30):
            sys.exit("kazoo: the waiter was not elected within 30 s")
        print(int((granted["at"] - t0) * 1e6), flush=True)
        current.join()
        current, let_go = thread, next_let_go

    let_go.set()
    current.join()
    for c in clients:
        c.stop()
        c.close()


if __name__ == "__main__":
    main()
