"""Tools off the training path: doctor (does the environment fit together?) and new_project
(copy this template under a new package name; standard library only)."""
