"""How a marin job learns its place in a pod (the `tpu` executor plugin starts the pods)."""
