"""The fleet's models (protocol 6): telling a worker on any replica to load or unload a model
(:mod:`.switcher`, the commands and their answers in :mod:`.commands` and :mod:`.replies`), loading a model
on demand and unloading idle ones (:mod:`.on_demand`, the choice of a worker in :mod:`.load_choice`, the
idle ones in :mod:`.keep_alive`), and the admin view (:mod:`.views`). What the fleet can serve (the models
loaded somewhere or loadable) is ``scheduling.worker_registry``'s.

The worker's side of a switch (the frames, the session's state) is the socket's, in
``workers.model_switching``; it answers the commands published here.

May import metrics, events, broker, settings, domain_errors; not scheduling, dispatch, workers or anything
above (the rebalancer in ``scheduling`` calls :class:`.switcher.ModelSwitcher`).
"""
