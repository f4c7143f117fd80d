"""The frontends: the @kernel DSL (dsl), Tensor (tensor) and DLPack exchange (dlpack). They build kernels with the
compiler layer and run them on devices; nothing below imports them."""
