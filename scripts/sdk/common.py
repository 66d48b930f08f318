"""Shared by the SDK drivers: run named steps, print `ok STEP` or
`FAIL STEP: ERROR`, and remember the last HTTP exchange so that a failure
says which request it came from (an SDK's own error often does not)."""

import os
import sys
import traceback

# The last request an SDK sent, as (method, url, status, body excerpt);
# each driver's transport hook fills it in.
last_exchange = None


def record(method, url, status, body):
    global last_exchange
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    last_exchange = (method, url, status, (body or "").replace("\n", " ")[:300])


class Steps:
    def __init__(self, sdk):
        self.sdk = sdk
        self.failed = []

    def run(self, name, fn, *needs):
        """Runs `fn` unless a value it needs is missing (an earlier step
        failed); a skip counts as a failure, so nothing passes unseen."""
        global last_exchange
        if any(n is None for n in needs):
            print(f"FAIL {name}: skipped, an earlier step it needs failed", flush=True)
            self.failed.append(name)
            return None
        last_exchange = None
        try:
            result = fn()
        except Exception as e:  # any SDK error is a step failure
            msg = f"{type(e).__name__}: {e}".replace("\n", " ")[:600]
            if last_exchange:
                m, u, s, b = last_exchange
                msg += f" [last request: {m} {u} -> {s} {b!r}]"
            print(f"FAIL {name}: {msg}", flush=True)
            if os.environ.get("SDK_CHECK_TRACE"):
                traceback.print_exc()
            self.failed.append(name)
            return None
        print(f"ok {name}", flush=True)
        return result

    def finish(self):
        if self.failed:
            print(f"{self.sdk}: {len(self.failed)} step(s) failed: {', '.join(self.failed)}", flush=True)
            sys.exit(1)
        print(f"{self.sdk}: all steps passed", flush=True)


def need(cond, what):
    """Turns a wrong answer that raised nothing into a step failure."""
    if not cond:
        raise AssertionError(what)
