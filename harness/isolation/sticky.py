"""Is this process still fit to run the next item after one failed? A sticky device error says no.

A CUDA fault inside a kernel (an illegal memory access, a device-side assert, a launch failure) leaves the process's
CUDA context unusable: every later CUDA call in that process fails, with messages that name no fault of the later
items. The only cure is a new process. After an item that did not pass, the process running it asks
``sticky_device_error``; a non-empty answer makes it report the item and exit, and the supervisor starts a fresh
process for the next item. The error's text is read on every device (a provider may surface a device error through
its own exception); on CUDA the context itself is asked too, since a provider may swallow the exception.
"""

from __future__ import annotations

# Phrases of torch's and the CUDA driver's messages for errors that leave the context unusable. "CUDA error" also
# matches some recoverable errors (out of memory); replacing the process after those costs one start-up, while
# keeping a poisoned one fails every later item.
STICKY_PHRASES = (
    "CUDA error",
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
)


def sticky_phrase(text: str) -> str:
    """The first of ``STICKY_PHRASES`` found in ``text``, or ""."""
    lowered = text.lower()
    return next((p for p in STICKY_PHRASES if p.lower() in lowered), "")


def context_error(device: str) -> str:
    """On CUDA: the error that a synchronize of the current device raises (the context is poisoned), or ""."""
    if device != "cuda":
        return ""
    import torch

    try:
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - any failure here means the context cannot run another item
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return ""


def sticky_device_error(text: str, device: str) -> str:
    """Why this process must not run anything more after an error whose report is ``text``, in one line; "" if
    it may go on."""
    broken = context_error(device)
    if broken:
        return f"the device context is unusable ({broken})"
    phrase = sticky_phrase(text)
    if phrase:
        first = next((line for line in text.splitlines() if phrase.lower() in line.lower()), phrase).strip()
        return f"sticky device error: {first[:300]}"
    return ""


def after_item(result, device: str) -> str:
    """``sticky_device_error`` after an item (a CheckResult) that did not pass; "" after one that did."""
    if not result.status.is_failure and result.status.value != "xfailed":
        return ""
    return sticky_device_error(f"{result.summary}\n{result.message}", device)
