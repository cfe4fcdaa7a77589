# SPDX-License-Identifier: Apache-2.0
"""A folder on the `ltpx` package's search path, holding only the `torch` package.

The root __init__.py appends this folder to `ltpx.__path__`, so `import
ltpx.torch` finds alias/torch/ (which re-exports ltpx.control.torchapi). The
name lives here and not at the repository root because the root is the
package and is on sys.path when the tests run: a root-level torch/ would
shadow PyTorch there. Nothing puts this folder itself on sys.path.
"""
