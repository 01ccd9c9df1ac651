"""`wireproto serve --workers N`: one supervisor process over N broker processes (docs/cluster.md).

`workers` is the supervisor: it binds the listening sockets, hands each new connection to a
worker (`handoff`, both sides), starts the private nats-server through which their hubs join
(`privatenats` keeps it running, `natsserver` runs the process), and starts, restarts
(`restarts`: after what pause) and stops the workers; `worker` is a worker process's main. The
package sits above the service, which runs in each worker, and beside the command, which starts
the supervisor: it imports the service, the config, the cluster's settings and the transports,
never the command, and neither the service nor the cluster imports it.
"""
