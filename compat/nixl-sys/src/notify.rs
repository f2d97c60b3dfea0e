//! Notifications received, by sender (NIXL's `nixl_notifs_t`).

use std::collections::HashMap;

use crate::NixlError;

/// Notifications by sending agent, in arrival order; [`crate::Agent::get_notifications`]
/// appends to it.
#[derive(Debug, Default)]
pub struct NotificationMap {
    pub(crate) agents: Vec<(String, Vec<Vec<u8>>)>,
}

impl NotificationMap {
    /// An empty map.
    pub fn new() -> Result<Self, NixlError> {
        Ok(Self::default())
    }

    /// The number of agents with notifications.
    pub fn len(&self) -> Result<usize, NixlError> {
        Ok(self.agents.len())
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> Result<bool, NixlError> {
        Ok(self.agents.is_empty())
    }

    /// The senders.
    pub fn agents(&self) -> NotificationMapAgentIterator<'_> {
        NotificationMapAgentIterator {
            map: self,
            index: 0,
        }
    }

    fn of(&self, agent_name: &str) -> Result<&Vec<Vec<u8>>, NixlError> {
        self.agents
            .iter()
            .find(|(a, _)| a == agent_name)
            .map(|(_, v)| v)
            .ok_or(NixlError::InvalidParam)
    }

    /// How many notifications `agent_name` sent (`InvalidParam` for an agent with none).
    pub fn get_notifications_size(&self, agent_name: &str) -> Result<usize, NixlError> {
        Ok(self.of(agent_name)?.len())
    }

    /// `agent_name`'s notifications (`InvalidParam` for an agent with none).
    pub fn get_notifications(
        &self,
        agent_name: &str,
    ) -> Result<NotificationIterator<'_>, NixlError> {
        let v = self.of(agent_name)?;
        Ok(NotificationIterator { items: v.iter() })
    }

    /// One notification's bytes (`InvalidParam` when there is none).
    pub fn get_notification_bytes(
        &self,
        agent_name: &str,
        index: usize,
    ) -> Result<Vec<u8>, NixlError> {
        self.of(agent_name)?
            .get(index)
            .cloned()
            .ok_or(NixlError::InvalidParam)
    }

    /// Every notification as text, by sender, emptying the map (`BackendError` for one that
    /// is not UTF-8, as in nixl-sys; the map is left unchanged then).
    pub fn take_notifs(&mut self) -> Result<HashMap<String, Vec<String>>, NixlError> {
        let mut out = HashMap::new();
        for (agent, notifs) in &self.agents {
            let texts = notifs
                .iter()
                .map(|n| String::from_utf8(n.clone()).map_err(|_| NixlError::BackendError))
                .collect::<Result<Vec<_>, _>>()?;
            out.insert(agent.clone(), texts);
        }
        self.agents.clear();
        Ok(out)
    }

    /// Appends what the agent received.
    pub(crate) fn extend(&mut self, notifs: nixl::Notifs) {
        let mut senders: Vec<_> = notifs.into_iter().collect();
        senders.sort_by(|a, b| a.0.cmp(&b.0));
        for (agent, msgs) in senders {
            match self.agents.iter_mut().find(|(a, _)| *a == agent) {
                Some((_, v)) => v.extend(msgs),
                None => self.agents.push((agent, msgs)),
            }
        }
    }
}

/// An iterator over a [`NotificationMap`]'s senders.
#[derive(Debug)]
pub struct NotificationMapAgentIterator<'a> {
    map: &'a NotificationMap,
    index: usize,
}

impl<'a> Iterator for NotificationMapAgentIterator<'a> {
    type Item = Result<&'a str, NixlError>;

    fn next(&mut self) -> Option<Self::Item> {
        let (a, _) = self.map.agents.get(self.index)?;
        self.index += 1;
        Some(Ok(a.as_str()))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.map.agents.len() - self.index;
        (n, Some(n))
    }
}

/// An iterator over one sender's notifications.
#[derive(Debug)]
pub struct NotificationIterator<'a> {
    items: std::slice::Iter<'a, Vec<u8>>,
}

impl Iterator for NotificationIterator<'_> {
    type Item = Result<Vec<u8>, NixlError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.items.next().map(|n| Ok(n.clone()))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.items.size_hint()
    }
}
