"""The scheduler: what a message costs its user in the fair queues (fair share), which worker takes a job
(capacity), one dispatcher per model on each replica, a new job handed to an idle worker inside the
transaction that creates it (hand-over), the operators' queue view (queue status), the connected
workers and the models they serve (worker registry), and which models the switchable workers serve
(the rebalancer: its policy, its snapshot of the fleet, its loop).

May import metrics, events, db, broker, settings; not dispatch, auth, workers, streams or anything above.
"""
