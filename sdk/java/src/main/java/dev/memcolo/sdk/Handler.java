package dev.memcolo.sdk;

/**
 * Gives memory back for a notification and returns the bytes given back. A handler
 * that throws is reported to the agent as a failed reclaim ({@code ok: false}); the
 * application keeps running.
 */
@FunctionalInterface
public interface Handler {
    long reclaim(Notification n) throws Exception;
}
