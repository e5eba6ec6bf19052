"""Building a workspace solution into the extension module `cuda_extension`: the fast build
(fast/) first, torch's own build when the fast one cannot decide."""
