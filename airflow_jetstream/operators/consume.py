"""JetStreamConsumeOperator: process messages in a Python function, as the Kafka provider's ConsumeFromTopicOperator."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, cast

from airflow_jetstream.client.errors import InvalidFunctionError
from airflow_jetstream.client.reading.apply_function import (
    DEFAULT_ACK_WAIT,
    DEFAULT_NAK_DELAY,
    ConsumeOptions,
    Duration,
    bind_function,
    load_function,
)
from airflow_jetstream.operators.base import JetStreamBaseOperator, subject_list, templated_int
from airflow_jetstream.ui.links import JetStreamViewLink


class JetStreamConsumeOperator(JetStreamBaseOperator):
    """Read messages from a stream and call ``apply_function`` on each one (or ``apply_function_batch`` per batch).

    Durable (``consumer`` given): a message is acknowledged only after the function returned for it; an
    exception listed in ``term_on`` terminates it (no redelivery) and consuming goes on, any other naks it with
    ``nak_delay`` and fails the task, so a retry loses and repeats nothing. Ordered read (no ``consumer``):
    ``start_seq``..``end_seq`` in order, nothing acknowledged; chain runs with the summary's ``next_seq``.
    Reads until ``max_messages`` or until no message arrives within ``fetch_timeout``. Returns a JSON summary
    (``processed``, ``acked``, ``terminated``, ``first_seq``, ``last_seq``, ``stopped``, ...); see
    docs/operators/consume.md.
    """

    template_fields: Sequence[str] = ("stream", "consumer", "filter_subjects", "start_seq", "start_time", "end_seq",
                                      "apply_function_args", "apply_function_kwargs")
    operator_extra_links = (JetStreamViewLink(),)

    def __init__(self, *, stream: str, apply_function: Callable[..., Any] | str | None = None,
                 apply_function_batch: Callable[..., Any] | str | None = None,
                 apply_function_args: Sequence[Any] | None = None, apply_function_kwargs: dict[str, Any] | None = None,
                 consumer: str | None = None, filter_subjects: Sequence[str] | str | None = None,
                 start_seq: int | str | None = None, start_time: datetime | str | None = None,
                 end_seq: int | str | None = None, max_messages: int | None = None, batch_size: int = 100,
                 fetch_timeout: Duration = 5.0, nak_delay: Duration | Sequence[Duration] = DEFAULT_NAK_DELAY,
                 term_on: Sequence[type[BaseException] | str] = (), create_consumer: bool = True,
                 ack_wait: Duration = DEFAULT_ACK_WAIT, max_deliver: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if (apply_function is None) == (apply_function_batch is None):
            raise InvalidFunctionError("give exactly one of apply_function (per message) or apply_function_batch "
                                       "(per batch)")
        self.stream = stream
        self.apply_function = apply_function
        self.apply_function_batch = apply_function_batch
        self.apply_function_args = apply_function_args
        self.apply_function_kwargs = apply_function_kwargs
        self.consumer = consumer
        self.filter_subjects = filter_subjects
        self.start_seq = start_seq
        self.start_time = start_time
        self.end_seq = end_seq
        self.term_on = tuple(term_on)
        self.create_consumer = create_consumer
        self.ack_wait = ack_wait
        self.max_deliver = max_deliver
        # bad classes or paths in term_on fail when the DAG is parsed
        self.options = ConsumeOptions(per_batch=apply_function_batch is not None, max_messages=max_messages,
                                      batch_size=batch_size, fetch_timeout=fetch_timeout, nak_delay=nak_delay,
                                      term_on=_term_classes(self.term_on))

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_jetstream.client.reading.consume import consume

        per_message = self.apply_function is not None
        function = self.apply_function if per_message else self.apply_function_batch
        assert function is not None  # __init__ requires exactly one of them
        func = bind_function(function, self.apply_function_args, self.apply_function_kwargs,
                             what="apply_function" if per_message else "apply_function_batch")
        consumer = self.consumer or None
        source = f"consumer {consumer}" if consumer else "an ordered read"
        self.log.info("Consuming stream %s via %s: up to %s message(s), batches of %d, waiting %.1f s for more",
                      self.stream, source, self.options.max_messages or "all", self.options.batch_size,
                      self.options.fetch_timeout_seconds)
        summary = self.hook.run(
            consume, self.stream, func, consumer=consumer, subjects=subject_list(self.filter_subjects),
            start_seq=templated_int(self.start_seq, "start_seq"), start_time=self.start_time or None,
            end_seq=templated_int(self.end_seq, "end_seq"), create=self.create_consumer,
            ack_wait=self.ack_wait, max_deliver=self.max_deliver, options=self.options,
        )
        self.log.info("Consumed %d message(s) of stream %s (seq %s..%s), %d acked, %d terminated, stopped: %s",
                      summary["processed"], self.stream, summary["first_seq"], summary["last_seq"], summary["acked"],
                      summary["terminated"], summary["stopped"])
        return summary


def _term_classes(term_on: tuple[type[BaseException] | str, ...]) -> tuple[type[BaseException], ...]:
    found = tuple(load_function(term, what="term_on") if isinstance(term, str) else term for term in term_on)
    if not all(isinstance(term, type) and issubclass(term, BaseException) for term in found):
        raise InvalidFunctionError(f"term_on must list exception classes or their dotted paths, got {term_on!r}")
    return cast(tuple[type[BaseException], ...], found)


__all__ = ["JetStreamConsumeOperator"]
