"""Stopping a training run part-way, as a Ctrl-C would."""


def interrupt_during(task, epoch, batch):
    """Makes ``task`` raise KeyboardInterrupt before batch ``batch`` of epoch ``epoch`` (both
    0-based), after the checkpoints of the epochs before it are written."""
    original = task.train_batches

    def interrupted(current_epoch, generator):
        for index, item in enumerate(original(current_epoch, generator)):
            if current_epoch == epoch and index == batch:
                raise KeyboardInterrupt
            yield item
    task.train_batches = interrupted
    return task
