"""The Holmes NIC labeller: a DaemonSet that reads each node's sysfs and writes Holmes' NIC labels
(kind, speed, HCAs, socket interface) on its own Node, so NIC discovery works on nodes that only
carry Node Feature Discovery labels. :mod:`.sysfs` reads, :mod:`.labels` decides (both pure),
``python -m holmes.labeller`` patches the Node."""
