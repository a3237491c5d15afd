"""The daemon's I/O side: proton handlers for clients, upstream connections (remote or embedded)."""
