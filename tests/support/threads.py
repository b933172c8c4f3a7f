"""Running work in several threads released together."""
import sys
import threading

THREADS = 4


def run_threads(work, n=THREADS):
    """Run ``work(i)`` in ``n`` threads released together, switching threads as often as the
    interpreter can (so that races show); re-raise the first exception."""
    start, errors = threading.Barrier(n), []

    def body(i):
        try:
            start.wait()
            work(i)
        except BaseException as e:   # noqa: BLE001 (collected and re-raised in the main thread)
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    if errors:
        raise errors[0]
