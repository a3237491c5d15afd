"""A receiving client that accepts some messages, leaves others unsettled and waits to be killed.
Usage: python killed_client.py URL ADDRESS SELECTOR TAKE ACCEPT"""

import sys

from proton.reactor import Selector
from proton.utils import BlockingConnection

url, address, selector, take, accept = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
conn = BlockingConnection(url, timeout=10)
receiver = conn.create_receiver(address, credit=take, options=Selector(selector) if selector != "-" else None)
print("attached", flush=True)  # (the attach was answered)
for i in range(take):
    message = receiver.receive(timeout=10)
    if i < accept:
        receiver.accept()
        print(f"accepted {message.body}", flush=True)
    else:
        print(f"holding {message.body}", flush=True)
try:  # run the connection a moment so the accepts actually go out before anyone kills us
    conn.wait(lambda: False, timeout=1)
except Exception:
    pass
print("ready", flush=True)
conn.wait(lambda: False, timeout=120)  # hold the unsettled ones until killed
