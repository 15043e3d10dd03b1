"""The runnable examples of the task pages (docs/tasks/): a package, so that a config can name a class of one by its
import path from the checkout's root, e.g. ``env.id: examples.custom_env:Spot``."""
